"""AutoregressiveDrafter: a small draft model on any SpeculativeEngine proposes k tokens."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..engine import DrafterBase, SpeculativeEngine, is_text_model, reusable_prefix
from ..errors import ConfigError, VocabMismatchError
from ..proposal import NO_PROPOSAL, DraftProposal, VerificationPolicy
from ..schedule import DraftBudget
from ..sampling import probs_from_logits, sample
from ..settings import MAX_CATCH_UP
from ..vocab import check_compatible


class AutoregressiveDrafter(DrafterBase):
    """Drafts greedily (or samples from q when the decoder samples) with a draft model.

    The draft engine's cache holds the committed context minus its last token (the
    anchor); each proposal feeds the unprocessed tail, then one token per step.
    After a round it rolls back past the rejected tokens, and the next proposal
    catches up on the correction/bonus token in the same pass as the anchor.
    ``p_min`` > 0 stops a greedy draft early when the draft's own top probability
    (softmax at temperature 1) falls below it.

    After a long run of plain steps (adaptive decoding found drafting doesn't pay), the
    draft would have to process every skipped token before it could propose again.
    When more than ``max_catch_up`` tokens are waiting, the drafter instead restarts its
    cache on the last ``max_catch_up`` tokens of the context: a shorter view for the draft,
    a bounded cost for the probe. Output is unaffected (the target verifies everything).
    """

    name = "draft-model"

    def __init__(self, engine: SpeculativeEngine, *, p_min: float = 0.0,
                 max_catch_up: int | None = MAX_CATCH_UP) -> None:
        if not 0.0 <= p_min < 1.0:
            raise ConfigError(f"p_min={p_min!r} must lie in [0, 1)")
        if max_catch_up is not None and max_catch_up < 1:
            raise ConfigError(f"max_catch_up={max_catch_up!r} must be >= 1 or None")
        self.engine = engine
        self.p_min = p_min
        self.max_catch_up = max_catch_up
        self._context: list[int] = []
        self._window_start = 0  # context index held at the draft cache's position 0

    @property
    def context(self) -> tuple[int, ...]:
        """The committed context the drafter follows."""
        return tuple(self._context)

    @property
    def cache_view(self) -> tuple[int, ...]:
        """The part of the context the draft's cache follows (its cache holds a prefix of it)."""
        return tuple(self._context[self._window_start:])

    @property
    def cost_engine(self) -> SpeculativeEngine:
        return self.engine

    def acceptance_priors(self, greedy: bool) -> tuple[float, ...]:
        return _P_PRIOR if greedy else _Q_PRIOR

    def check_target(self, target: SpeculativeEngine) -> None:
        """Raise VocabMismatchError unless the draft's token ids mean the same text to ``target``."""
        if target is self.engine:
            raise ConfigError("the draft engine is the target engine itself; load the draft model separately")
        if is_text_model(target) and is_text_model(self.engine):
            check_compatible(target, self.engine)
        elif target.n_vocab != self.engine.n_vocab:  # engines without texts (InMemoryEngine): sizes only
            raise VocabMismatchError(
                f"vocabulary sizes differ: target {target.n_vocab}, draft {self.engine.n_vocab}")

    def start(self, prompt_tokens: Sequence[int]) -> None:
        engine = self.engine
        prefix = list(prompt_tokens[:-1])
        keep = reusable_prefix(engine, prefix)
        engine.reset(keep)
        self._context = list(prompt_tokens)  # the cache is a prefix of it even if the prefill fails
        self._window_start = 0
        if len(prefix) > keep:
            engine.advance(prefix[keep:])

    def propose(self, max_tokens: int, policy: VerificationPolicy, rng: np.random.Generator,
                budget: DraftBudget | None = None) -> DraftProposal:
        engine, ctx = self.engine, self._context
        waiting = len(ctx) - self._window_start - engine.n_past
        if self.max_catch_up is not None and waiting > self.max_catch_up:
            engine.reset(0)  # restart the draft's view on the recent context (see class docs)
            self._window_start = len(ctx) - self.max_catch_up
        if len(ctx) - self._window_start + max_tokens > engine.n_ctx:
            # The draft's context is full (it may be smaller than the target's): keep drafting
            # from the most recent half of it rather than stopping.
            engine.reset(0)
            self._window_start = len(ctx) - max(1, engine.n_ctx // 2)
        view = len(ctx) - self._window_start
        # After k steps the cache holds view - 1 + k tokens.
        max_tokens = min(max_tokens, engine.n_ctx - view + 1)
        if max_tokens <= 0:
            return NO_PROPOSAL
        # The anchor; after a round also the correction/bonus token; after plain steps all skipped.
        feed = ctx[self._window_start + engine.n_past:]
        want_rows = not policy.greedy or self.p_min > 0.0 or budget is not None
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        buckets: list[int] = []
        reach = 1.0
        for _ in range(max_tokens):
            if not want_rows:
                tokens.append(engine.forward_last_argmax(feed))
                feed = tokens[-1:]
                continue
            logits = engine.forward_last_logits(feed)  # [V], valid until the next call
            if policy.greedy:
                token = int(np.argmax(logits))
                confidence = _top_probability(logits, token)
                if confidence < self.p_min:
                    break
            else:
                draft_probs = probs_from_logits(logits, policy.sampling)  # [V], a new array
                token = sample(draft_probs, rng)
                confidence = float(draft_probs[token])
                rows.append(draft_probs)
            tokens.append(token)
            feed = tokens[-1:]
            if budget is not None:
                bucket = _prob_bucket(confidence)
                buckets.append(bucket)
                reach *= budget.confidence(bucket, len(tokens) - 1)
                # Draw on only where the next tokens can pay, guessed before drawing them (budget.guess).
                if not budget.keep_drafting(len(tokens), reach, budget.guess(bucket, len(tokens))):
                    break
        if not tokens:
            return NO_PROPOSAL
        return DraftProposal(tokens=tuple(tokens), draft_probs=np.stack(rows) if rows else None,
                             buckets=tuple(buckets) if budget is not None else None)

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        kept = len(self._context) - self._window_start + min(n_accepted, len(committed))
        if self.engine.n_past > kept:
            self.engine.reset(kept)
        self._context.extend(committed)

    def rollback(self) -> None:
        limit = max(len(self._context) - self._window_start - 1, 0)
        if self.engine.n_past > limit:
            self.engine.reset(limit)


# Confidence buckets: the draft's own probability of its token (greedy: its top probability;
# sampling: q(x) of the sampled token). Greedy priors lean below the probability itself: a draft is
# usually over-confident relative to a larger target.
_P_EDGES = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.995)
_P_PRIOR = (0.15, 0.3, 0.45, 0.58, 0.68, 0.77, 0.85, 0.9, 0.94)
# Sampled, a drawn token is accepted with chance min(1, p(x)/q(x)): a low q(x) is often a confident
# draft's less likely token, which the target takes as often, so the chance hardly falls with q(x).
# Measured by bucket at T = 0.8 (teacher-forced, 320 draws): 0.64 -> 1.0 (tiny F32 pair), 0.80 -> 1.0
# (tiny-big-q8), 0.89 -> 1.0 (tiny-wide), 0.95 -> 1.0 (Gemma 3 270M F16 / Q4_K_M). The greedy priors
# (0.15 at q(x) < 0.3) kept a cold run from ever verifying such a draft (docs/performance.md,
# twenty-fifth); these sit below every pair measured.
_Q_PRIOR = (0.45, 0.5, 0.55, 0.6, 0.68, 0.75, 0.83, 0.88, 0.92)


def _prob_bucket(p: float) -> int:
    for i in range(len(_P_EDGES) - 1, 0, -1):
        if p >= _P_EDGES[i]:
            return i
    return 0


def _top_probability(logits: np.ndarray, top: int) -> float:
    """softmax(logits)[top] for the argmax ``top``, without normalizing the vector. In float32, in one
    scratch array: on a 262,144-token vocabulary the float64 version took 564 µs a drafted token, this
    one ~230 µs (a bucket needs nowhere near float64's precision)."""
    shifted = np.subtract(logits, logits[top], dtype=np.float32)  # [V], <= 0
    np.exp(shifted, out=shifted)
    return float(1.0 / shifted.sum())
