"""Simulated engines on a virtual clock: policies evaluated without timing noise.

A :class:`TraceEngine` is a target whose greedy output is a given token sequence (a
recorded generation, or a synthetic one) and whose passes cost what a
:class:`~specdec_gguf.profile.CostProfile` says (a one-token pass after one of another size
also pays its ``switch_seconds``), on a :class:`VirtualClock`. A
:class:`SimulatedDraftEngine` is a draft model that agrees with the trace where a
per-position agreement pattern says so and reports a confidence correlated with it.
Pass the clock to ``SpeculativeDecoder(..., clock=clock)``: the schedule then sees
exactly the costs of the profile, so a benchmark over many cost curves and traces is
deterministic and takes milliseconds (benchmarks/policy_sim.py, tests/test_schedule.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..engine import EngineBase, check_tokens
from ..errors import EngineError
from ..profile import CostProfile


class VirtualClock:
    """A clock that only moves when a simulated pass says so; call it for the time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TraceEngine(EngineBase):
    """A target whose argmax after position p is ``trace[p + 1]`` (``filler`` past the end).

    Valid for greedy decoding: the committed context is always a prefix of the trace, and
    argmaxes after a wrongly drafted token are never used. Logits put ``margin`` on the
    trace token, so ``forward_logits`` works too (a peaked target, not a sampling model).
    """

    def __init__(self, trace: Sequence[int], n_vocab: int, costs: CostProfile, clock: VirtualClock, *,
                 n_ctx: int = 1 << 16, filler: int = 0, margin: float = 20.0) -> None:
        self.trace = np.asarray(trace, dtype=np.int32)
        check_tokens(self.trace.tolist(), n_vocab, "trace token")
        self._n_vocab, self._n_ctx = n_vocab, n_ctx
        self.costs, self.clock = costs, clock
        self.filler, self.margin = filler, margin
        self._tokens: list[int] = []
        self.passes = 0
        self._last_size = 0  # the previous pass's size: a one-token pass after another size pays the switch

    n_ctx = property(lambda self: self._n_ctx)
    n_vocab = property(lambda self: self._n_vocab)
    n_past = property(lambda self: len(self._tokens))
    tokens = property(lambda self: tuple(self._tokens))

    def reset(self, n_past: int) -> None:
        if not 0 <= n_past <= len(self._tokens):
            raise EngineError(f"reset({n_past}) outside [0, {len(self._tokens)}]")
        del self._tokens[n_past:]

    def _next(self, start: int, n: int) -> np.ndarray:
        idx = np.arange(start + 1, start + n + 1)
        out = np.full(n, self.filler, dtype=np.int32)
        inside = idx < len(self.trace)
        out[inside] = self.trace[idx[inside]]
        return out

    def _pass(self, tokens: Sequence[int]) -> int:
        check_tokens(tokens, self._n_vocab)
        if len(self._tokens) + len(tokens) > self._n_ctx:
            raise EngineError(f"context full: {len(self._tokens)} + {len(tokens)} > n_ctx={self._n_ctx}")
        start = len(self._tokens)
        self._tokens.extend(int(t) for t in tokens)
        if tokens:
            switch = self.costs.switch_seconds if len(tokens) == 1 and self._last_size != 1 else 0.0
            self.clock.advance(self.costs.cost(len(tokens)) + switch)
            self.passes += 1
            self._last_size = len(tokens)
        return start

    def advance(self, tokens: Sequence[int]) -> None:
        self._pass(tokens)

    def forward_argmax(self, tokens: Sequence[int]) -> np.ndarray:
        start = self._pass(tokens)
        return self._next(start, len(tokens))

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        start = self._pass(tokens)
        out = np.zeros((len(tokens), self._n_vocab), dtype=np.float32)
        out[np.arange(len(tokens)), self._next(start, len(tokens))] = self.margin
        return out

    # One pass, as llama.cpp runs them (EngineBase's advance-then-forward would be two, each paying a
    # pass's fixed cost: a simulated draft paid one extra pass per proposal).
    def forward_last_argmax(self, tokens: Sequence[int]) -> int:
        if len(tokens) == 0:
            raise EngineError("forward_last_* needs at least one token")
        return int(self.forward_argmax(tokens)[-1])

    def forward_last_logits(self, tokens: Sequence[int]) -> np.ndarray:
        if len(tokens) == 0:
            raise EngineError("forward_last_* needs at least one token")
        return self.forward_logits(tokens)[-1]


class SimulatedDraftEngine(TraceEngine):
    """A draft model for a trace: after position p it proposes ``trace[p + 1]`` where ``agree[p + 1]``,
    else another token, with top probability ``confidence[p + 1]``.

    Draft passes cost what ``costs`` says (the draft's own profile) on the same clock, and a pass after
    another engine's (the first of a proposal) ``overhead`` seconds more: a real draft's own work per
    proposal and its weights evicted by the target's pass (DraftPrice fits it apart from the profile).
    """

    def __init__(self, trace: Sequence[int], agree: Sequence[bool], confidence: Sequence[float], n_vocab: int,
                 costs: CostProfile, clock: VirtualClock, *, overhead: float = 0.0, **kwargs: object) -> None:
        super().__init__(trace, n_vocab, costs, clock, **kwargs)  # type: ignore[arg-type]
        self.overhead = overhead
        self._left_at = clock()  # the clock when this engine's last pass ended
        if len(agree) != len(trace) or len(confidence) != len(trace):
            raise ValueError("agree and confidence need one entry per trace position")
        self.agree = np.asarray(agree, dtype=bool)
        self.confidence = np.clip(np.asarray(confidence, dtype=np.float64), 1e-3, 1 - 1e-6)

    def _next(self, start: int, n: int) -> np.ndarray:
        right = super()._next(start, n)
        idx = np.arange(start + 1, start + n + 1)
        inside = idx < len(self.trace)
        wrong = inside.copy()
        wrong[inside] = ~self.agree[idx[inside]]
        return np.where(wrong, (right + 1) % self._n_vocab, right).astype(np.int32)

    def _pass(self, tokens: Sequence[int]) -> int:
        if tokens and self.overhead and self.clock() != self._left_at:
            self.clock.advance(self.overhead)  # (the clock moved: another engine ran since this one's last pass)
        start = super()._pass(tokens)
        self._left_at = self.clock()
        return start

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        start = self._pass(tokens)
        n = len(tokens)
        picks = self._next(start, n)
        idx = np.minimum(np.arange(start + 1, start + n + 1), len(self.trace) - 1)
        top = self.confidence[idx]
        # The top token gets probability `top`, the rest share 1 - top evenly.
        rest = np.log((1 - top) / (self._n_vocab - 1))
        out = np.repeat(rest[:, None], self._n_vocab, axis=1).astype(np.float32)
        out[np.arange(n), picks] = np.log(top)
        return out
