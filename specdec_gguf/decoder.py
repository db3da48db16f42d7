"""SpeculativeDecoder: the propose -> verify -> accept/rollback loop."""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Iterable, Iterator, Literal, Sequence

import numpy as np

from . import sampling as _sampling
from .engine import DrafterEngine, SpeculativeEngine, check_tokens, reusable_prefix
from .errors import ConfigError, ContextOverflowError, SpecDecError
from .proposal import DraftProposal, VerificationPolicy
from .sampling import SamplingParams
from .schedule import AdaptiveSchedule, DraftSchedule, FixedSchedule
from .stats import SpecStats

Origin = Literal["accepted", "correction", "bonus", "target"]
StopReason = Literal["eog", "stop_token", "length", "context"]
_NO_PROPOSAL = DraftProposal()


@dataclass(frozen=True)
class RoundEvent:
    """What one round added: tokens, each token's origin, the live stats, and why it stopped (last round only)."""

    tokens: tuple[int, ...]
    origins: tuple[Origin, ...]
    stats: SpecStats
    stop_reason: StopReason | None = None


@dataclass(frozen=True)
class GenerationResult:
    """The generated tokens (stop tokens excluded), the run's stats and why it stopped."""

    tokens: list[int]
    stats: SpecStats
    stop_reason: StopReason


class SpeculativeDecoder:
    """Generate with ``target``, letting ``drafter`` propose up to ``num_draft_tokens`` per round.

    ``drafter=None`` is plain target-only decoding through the same loop (the fair
    baseline). Each round drafts ``num_draft_tokens`` tokens, or with ``adaptive=True``
    the k in [0, num_draft_tokens] that the measured cost model predicts is fastest
    (k = 0 is a plain step); ``schedule`` plugs in any other :class:`DraftSchedule`. Greedy output equals the
    target's own greedy output for any drafter and k; sampling follows Chen et al. (2023).
    """

    def __init__(self, target: SpeculativeEngine, drafter: DrafterEngine | None = None, *,
                 num_draft_tokens: int = 4, adaptive: bool = False, draft_min: int = 0,
                 schedule: DraftSchedule | None = None) -> None:
        if not isinstance(num_draft_tokens, int) or not 1 <= num_draft_tokens <= target.n_ctx:
            raise ConfigError(
                f"num_draft_tokens={num_draft_tokens!r} must be an integer in [1, n_ctx={target.n_ctx}]")
        if not isinstance(draft_min, int) or not 0 <= draft_min <= num_draft_tokens:
            raise ConfigError(f"draft_min={draft_min!r} must be an integer in [0, num_draft_tokens={num_draft_tokens}]")
        if drafter is not None:
            drafter.check_target(target)  # before any generation: a mismatch would decode garbage
        self.target = target
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens
        self.draft_min = draft_min
        if schedule is None:
            schedule = AdaptiveSchedule(num_draft_tokens) if adaptive else FixedSchedule(num_draft_tokens)
        self.schedule = schedule

    def generate(self, prompt_tokens: Sequence[int], max_new_tokens: int,
                 sampling: SamplingParams = SamplingParams(),
                 stop_token_ids: Iterable[int] | None = None, *, ignore_eog: bool = False) -> GenerationResult:
        """Run to a stop and return every generated token with the stats."""
        tokens: list[int] = []
        last: RoundEvent | None = None
        for last in self.stream(prompt_tokens, max_new_tokens, sampling, stop_token_ids, ignore_eog=ignore_eog):
            tokens.extend(last.tokens)
        assert last is not None and last.stop_reason is not None  # stream always ends on a stop
        return GenerationResult(tokens=tokens, stats=last.stats, stop_reason=last.stop_reason)

    def stream(self, prompt_tokens: Sequence[int], max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(),
               stop_token_ids: Iterable[int] | None = None, *, ignore_eog: bool = False) -> Iterator[RoundEvent]:
        """Yield one RoundEvent per round; the last one carries ``stop_reason``.

        The stats object is live (updated in place); take ``.copy()`` to keep a snapshot.
        ``ignore_eog`` keeps generating past end-of-generation tokens (benchmarks).
        """
        prompt = self._validate(prompt_tokens, max_new_tokens)
        return self._rounds(prompt, max_new_tokens, sampling, frozenset(stop_token_ids or ()), ignore_eog)

    def _validate(self, prompt_tokens: Sequence[int], max_new_tokens: int) -> list[int]:
        prompt = [int(t) for t in prompt_tokens]
        if not prompt:
            raise ConfigError("the prompt is empty: give at least one token (e.g. BOS)")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
        if len(prompt) >= self.target.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens but n_ctx={self.target.n_ctx} leaves no room to "
                f"generate; use a prompt shorter than {self.target.n_ctx} tokens or a larger context")
        check_tokens(prompt, self.target.n_vocab, "prompt token")
        return prompt

    def _rounds(self, prompt: list[int], max_new_tokens: int, params: SamplingParams,
                stops: frozenset[int], ignore_eog: bool) -> Iterator[RoundEvent]:
        target, drafter, schedule = self.target, self.drafter, self.schedule
        is_eog = (lambda token: False) if ignore_eog else target.is_eog
        policy, rng = VerificationPolicy.from_sampling(params), params.rng()
        stats = SpecStats(prompt_tokens=len(prompt))
        context = list(prompt)  # committed tokens; the cache holds all but the last (the anchor)
        mirror = np.zeros(min(target.n_ctx, len(prompt) + max_new_tokens), dtype=np.int32)  # context as an array
        mirror[: len(prompt)] = prompt
        try:
            t0 = perf_counter()
            self._prefill(prompt[:-1])
            if drafter is not None:
                drafter.start(prompt)
            stats.prefill_seconds = perf_counter() - t0
            schedule.start()
            while True:
                t_round = perf_counter()
                room = min(target.n_ctx - len(context), max_new_tokens - (len(context) - len(prompt))) - 1
                k = min(schedule.next_k(), room) if drafter is not None else 0
                proposal = drafter.propose(k, policy, rng) if k > 0 else _NO_PROPOSAL
                if proposal.parents is not None and not proposal.is_linear:
                    raise SpecDecError("the drafter proposed a tree; this decoder verifies linear proposals only")
                proposal = _fit_to_target(proposal, target.n_vocab)
                if len(proposal.tokens) < self.draft_min:
                    proposal = _NO_PROPOSAL  # too short to pay for a verify pass (llama.cpp's --draft-min)
                t_verify = perf_counter()
                out = target.forward_proposal(context[-1], proposal, greedy=policy.greedy)
                if policy.greedy:
                    n_acc, token = _sampling.greedy_accept(proposal.tokens, out)
                else:
                    n_acc, token = _sampling.rejection_sample(
                        proposal.tokens, proposal.draft_probs, out, params, rng)
                new = [*proposal.tokens[:n_acc], token]
                last: Origin = "target" if not proposal.tokens else (
                    "bonus" if n_acc == len(proposal.tokens) else "correction")
                origins: list[Origin] = ["accepted"] * n_acc + [last]
                stop_reason: StopReason | None = None
                for i, t in enumerate(new):
                    if t in stops or is_eog(t):
                        stop_reason = "stop_token" if t in stops else "eog"
                        del new[i:], origins[i:]
                        break
                mirror[len(context):len(context) + len(new)] = new
                context.extend(new)
                target.reset(len(context) - 1)
                if drafter is not None:
                    drafter.accept(n_acc, new)
                t_end = perf_counter()
                stats.record_round(len(proposal.tokens), n_acc, len(new))
                stats.draft_seconds += t_verify - t_round
                stats.verify_seconds += t_end - t_verify
                stats.generation_seconds += t_end - t_round
                schedule.observe(len(proposal.tokens), n_acc, t_verify - t_round, t_end - t_verify)
                if stop_reason is None:
                    if len(context) - len(prompt) >= max_new_tokens:
                        stop_reason = "length"
                    elif len(context) >= target.n_ctx:
                        stop_reason = "context"
                yield RoundEvent(tuple(new), tuple(origins), stats, stop_reason)
                if stop_reason is not None:
                    return
                if not _holds(target, mirror[: len(context) - 1]):
                    self._resync(context)  # another generation used the engine while this one was paused
        except GeneratorExit:
            # Closed (or garbage-collected) while paused at a yield: the caches were consistent
            # then, and may since belong to another generation or a closed engine. Touch nothing.
            raise
        except BaseException:
            self._restore(context)
            raise

    def _prefill(self, prefix: list[int]) -> None:
        """Fill the target's cache with ``prefix``, reusing whatever leading part it already holds."""
        keep = reusable_prefix(self.target, prefix)
        self.target.reset(keep)
        if len(prefix) > keep:
            self.target.advance(prefix[keep:])

    def _resync(self, context: list[int]) -> None:
        """Make the target's cache (and the drafter, with its draft model's cache) follow ``context`` again."""
        self._prefill(context[:-1])
        if self.drafter is not None:
            self.drafter.start(context)

    def _restore(self, context: list[int]) -> None:
        """After an error, leave both engines at the committed context (best effort)."""
        try:
            self.target.reset(min(self.target.n_past, len(context) - 1))
        except SpecDecError:
            pass
        if self.drafter is not None:
            try:
                self.drafter.rollback()
            except SpecDecError:
                pass


def _holds(engine: SpeculativeEngine, committed: np.ndarray) -> bool:
    """Whether the engine's cache is exactly ``committed`` (its own record, compared in one numpy pass)."""
    return engine.n_past == len(committed) and bool(np.array_equal(engine.tokens, committed))


def _fit_to_target(proposal: DraftProposal, n_vocab: int) -> DraftProposal:
    """Cut a proposal before the first id the target cannot take, and size q's rows to the target's vocabulary.

    A draft vocabulary may be up to 128 ids larger than the target's (vocab.py); the target
    gives such ids probability 0, so cutting there and dropping q's extra columns (or
    padding missing ones with 0) leaves the acceptance and the residual exact.
    """
    tokens, probs = proposal.tokens, proposal.draft_probs
    cut = next((i for i, t in enumerate(tokens) if not 0 <= t < n_vocab), len(tokens))
    fits = probs is None or probs.ndim == 1 or probs.shape[1] == n_vocab
    if cut == len(tokens) and fits:
        return proposal
    if probs is not None:
        probs = probs[:cut]
        if probs.ndim == 2 and probs.shape[1] != n_vocab:
            aligned = np.zeros((cut, n_vocab), dtype=probs.dtype)
            width = min(n_vocab, probs.shape[1])
            aligned[:, :width] = probs[:, :width]
            probs = aligned
    return DraftProposal(tokens=tokens[:cut], draft_probs=probs, features=proposal.features,
                         parents=proposal.parents[:cut] if proposal.parents is not None else None)
