"""InMemoryEngine: a deterministic, table-driven stand-in for a model, with no files.

Next-token logits are a fixed function of the last two tokens of the context, so
the same context always gives the same logits and rollback is testable exactly.
``perturbed`` builds a related engine (a draft) whose agreement falls as noise rises.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from ..engine import EngineBase, argmax_ids, token_array
from ..errors import EngineError


class InMemoryEngine(EngineBase):
    """A tiny "language model": logits = sharpness * (A[last] + 0.5 * B[previous]).

    ``forward_passes`` counts forward_argmax/forward_logits calls (verify and draft
    passes), ``advance_calls`` counts prefills. Set ``fail_at_call`` to make the
    n-th call (0-based, counting advance and forwards together) raise EngineError
    once, after it has written its tokens — the worst case a decoder must undo.

    Like llama.cpp's output buffer, one logits buffer is reused: an array returned by
    ``forward_logits``/``forward_argmax`` is overwritten by the next call, so tests catch
    callers that keep a view past the next call (the protocol's buffer-ownership rule).
    """

    def __init__(self, table_last: np.ndarray, table_prev: np.ndarray, *, n_ctx: int = 4096,
                 sharpness: float = 1.0, eog_token_ids: Iterable[int] = ()) -> None:
        if table_last.shape != table_prev.shape or table_last.ndim != 2 \
                or table_last.shape[0] != table_last.shape[1]:
            raise ValueError("tables must both be [n_vocab, n_vocab]")
        if n_ctx < 1:
            raise ValueError(f"n_ctx={n_ctx} must be >= 1")
        self._table_last = table_last.astype(np.float32)
        self._table_prev = table_prev.astype(np.float32)
        self._n_ctx = n_ctx
        self.sharpness = float(sharpness)
        self.eog_token_ids = frozenset(int(t) for t in eog_token_ids)
        self._tokens: list[int] = []
        self.forward_passes = 0
        self.advance_calls = 0
        self.calls = 0
        self.fail_at_call: int | None = None
        self._out = np.empty((0, self.n_vocab), dtype=np.float32)  # the reused logits buffer
        self._closed = False

    @classmethod
    def random(cls, vocab_size: int, *, seed: int, n_ctx: int = 4096, sharpness: float = 3.0,
               eog_token_ids: Iterable[int] = ()) -> InMemoryEngine:
        """A random engine; higher ``sharpness`` makes its distributions peakier."""
        if vocab_size < 2:
            raise ValueError(f"vocab_size={vocab_size} must be >= 2")
        rng = np.random.default_rng(seed)
        return cls(rng.standard_normal((vocab_size, vocab_size)),
                   rng.standard_normal((vocab_size, vocab_size)),
                   n_ctx=n_ctx, sharpness=sharpness, eog_token_ids=eog_token_ids)

    def perturbed(self, noise: float, *, seed: int, n_ctx: int | None = None) -> InMemoryEngine:
        """A related engine: the same tables plus ``noise`` times Gaussian noise."""
        rng = np.random.default_rng(seed)
        shape = self._table_last.shape
        return InMemoryEngine(self._table_last + noise * rng.standard_normal(shape),
                              self._table_prev + noise * rng.standard_normal(shape),
                              n_ctx=self._n_ctx if n_ctx is None else n_ctx,
                              sharpness=self.sharpness, eog_token_ids=self.eog_token_ids)

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_vocab(self) -> int:
        return self._table_last.shape[0]

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The tokens in the KV cache (for tests)."""
        return tuple(self._tokens)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the in-memory engine is closed")

    def close(self) -> None:
        self._closed = True

    def is_eog(self, token: int) -> bool:
        self._check_open()
        return token in self.eog_token_ids

    def reset(self, n_past: int) -> None:
        self._check_open()
        if not 0 <= n_past <= len(self._tokens):
            raise EngineError(f"reset({n_past}) outside [0, {len(self._tokens)}]")
        del self._tokens[n_past:]

    def advance(self, tokens: Sequence[int]) -> None:
        self.advance_calls += 1
        self._append(tokens)

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        self.forward_passes += 1
        start = len(self._tokens)
        self._append(tokens)
        ctx = self._tokens
        last = np.asarray(ctx[start:], dtype=np.int64)
        prev = np.asarray([ctx[i - 1] if i > 0 else 0 for i in range(start, len(ctx))], dtype=np.int64)
        if len(self._out) < len(last):
            self._out = np.empty((max(len(last), 2 * len(self._out)), self.n_vocab), dtype=np.float32)
        out = self._out[: len(last)]  # [n, V], overwritten by the next call
        np.multiply(self._table_last[last] + 0.5 * self._table_prev[prev], self.sharpness, out=out)
        return out

    def forward_argmax(self, tokens: Sequence[int]) -> np.ndarray:
        start = len(self._tokens)
        return argmax_ids(self.forward_logits(tokens), "in-memory engine", start)

    def logits_for(self, context: Sequence[int]) -> np.ndarray:
        """Next-token logits after ``context`` without touching the cache ``[V]``."""
        prev = context[-2] if len(context) > 1 else 0
        return self.sharpness * (self._table_last[context[-1]] + 0.5 * self._table_prev[prev])

    def _append(self, tokens: Sequence[int]) -> None:
        self._check_open()
        tokens = token_array(tokens, self.n_vocab).tolist()
        if len(self._tokens) + len(tokens) > self._n_ctx:
            raise EngineError(
                f"context full: {len(self._tokens)} + {len(tokens)} tokens > n_ctx={self._n_ctx}")
        self._tokens.extend(int(t) for t in tokens)
        call, self.calls = self.calls, self.calls + 1
        if self.fail_at_call is not None and call == self.fail_at_call:
            self.fail_at_call = None
            raise EngineError(f"injected fault at call {call}")
