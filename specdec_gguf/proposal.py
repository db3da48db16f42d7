"""Value types that travel between drafter, decoder and target."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .sampling import SamplingParams


@dataclass(frozen=True)
class DrafterFeatures:
    """Hidden-state features an attached-head drafter (Medusa/EAGLE style) would consume.

    Today's drafters neither produce nor read them; the verify path carries them
    so such a drafter can be added without changing the protocol.
    """

    hidden: np.ndarray | None = None  # [n, n_embd]
    layer: int | None = None


@dataclass(frozen=True)
class DraftProposal:
    """The k tokens a drafter proposes for one round.

    ``draft_probs`` is either None (a deterministic drafter: q is one-hot at each
    token), the full draft distributions ``[k, n_vocab]``, or q(x) per token ``[k]``.
    q(x) alone decides acceptance but not the residual: verification raises rather
    than guess when a rejection needs the full row.
    ``parents[i]`` is the index of token i's parent (-1 = the anchor); a linear
    proposal has ``parents == [-1, 0, 1, ...]`` or None.
    ``buckets[i]`` labels what the drafter knew about token i before verification (see
    confidence.py); the adaptive schedule turns it into a calibrated acceptance chance.
    None: the schedule falls back to per-slot estimates.
    """

    tokens: tuple[int, ...] = ()
    draft_probs: np.ndarray | None = None
    parents: tuple[int, ...] | None = None
    features: DrafterFeatures | None = None
    buckets: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if type(self.tokens) is not tuple:  # drafters pass tuples of ints: no copy on the hot path
            object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        if self.draft_probs is not None and len(self.draft_probs) != len(self.tokens):
            raise ValueError(
                f"draft_probs has {len(self.draft_probs)} rows for {len(self.tokens)} tokens"
            )
        if self.parents is not None and len(self.parents) != len(self.tokens):
            raise ValueError(f"parents has {len(self.parents)} entries for {len(self.tokens)} tokens")
        if self.buckets is not None and len(self.buckets) != len(self.tokens):
            raise ValueError(f"buckets has {len(self.buckets)} entries for {len(self.tokens)} tokens")

    def __len__(self) -> int:
        return len(self.tokens)

    def prefix(self, k: int) -> DraftProposal:
        """The first ``k`` tokens (with their rows, parents and buckets)."""
        if k >= len(self.tokens):
            return self
        return DraftProposal(
            tokens=self.tokens[:k], features=self.features,
            draft_probs=self.draft_probs[:k] if self.draft_probs is not None else None,
            parents=self.parents[:k] if self.parents is not None else None,
            buckets=self.buckets[:k] if self.buckets is not None else None)

    @property
    def is_linear(self) -> bool:
        """True when each token's parent is the token before it (a chain, not a tree)."""
        return self.parents is None or all(p == i - 1 for i, p in enumerate(self.parents))


@dataclass(frozen=True)
class VerificationPolicy:
    """How the target checks a proposal: greedy argmax match, or Chen et al. rejection sampling."""

    sampling: SamplingParams = field(default_factory=SamplingParams)

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    @classmethod
    def from_sampling(cls, sampling: SamplingParams) -> VerificationPolicy:
        return cls(sampling=sampling)


NO_PROPOSAL = DraftProposal()  # the empty proposal (immutable, shared: a plain step)
