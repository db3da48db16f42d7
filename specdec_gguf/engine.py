"""The engine protocol every target and draft model sits behind, and the error hierarchy.

An engine owns one sequence's KV cache. ``n_past`` is the number of tokens in that
cache and the rollback anchor: every forward call appends its tokens, and the
decoder calls :meth:`SpeculativeEngine.reset` to drop what it rejected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .proposal import DraftProposal, VerificationPolicy


class SpecDecError(Exception):
    """Base class of every error specdec-gguf raises on purpose."""


class EngineError(SpecDecError):
    """An engine could not load, run or be reached (bad file, backend failure, dead child)."""


class RollbackUnsupportedError(EngineError):
    """The engine's memory cannot be cut back to the requested length."""


class VocabMismatchError(SpecDecError):
    """Draft and target vocabularies differ, so draft tokens would mean other text."""


class ContextOverflowError(SpecDecError):
    """The prompt (plus room for one new token) does not fit the context window."""


class ConfigError(SpecDecError, ValueError):
    """A setting is invalid: names the setting, the bad value and what is allowed."""


@runtime_checkable
class SpeculativeEngine(Protocol):
    """One model with one sequence's KV cache, as the decoder sees it.

    Engines may subclass this protocol to inherit the linear ``forward_proposal``
    and the ``is_eog``/``close`` defaults.
    """

    @property
    def n_ctx(self) -> int:
        """Capacity of the KV cache in tokens."""
        ...

    @property
    def n_vocab(self) -> int:
        """Number of rows in a logits vector."""
        ...

    @property
    def n_past(self) -> int:
        """Tokens currently committed to the KV cache."""
        ...

    def reset(self, n_past: int) -> None:
        """Roll back so exactly ``n_past`` tokens remain; raises RollbackUnsupportedError if it can't."""
        ...

    def advance(self, tokens: Sequence[int]) -> None:
        """Prefill ``tokens`` without materializing logits."""
        ...

    def forward_argmax(self, tokens: Sequence[int]) -> np.ndarray:
        """One pass; the argmax of the next-token logits at each input position (int32 ``[n]``)."""
        ...

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """One pass; the next-token logits at each input position (float32 ``[n, n_vocab]``)."""
        ...

    def forward_proposal(self, anchor: int, proposal: DraftProposal, *, greedy: bool) -> np.ndarray:
        """Verify ``[anchor] + proposal.tokens`` in one pass.

        Greedy returns argmax ids ``[k + 1]``; sampling returns logits ``[k + 1, n_vocab]``.
        The default is linear; a tree-aware engine overrides it.
        """
        tokens = [anchor, *proposal.tokens]
        return self.forward_argmax(tokens) if greedy else self.forward_logits(tokens)

    def forward_last_argmax(self, tokens: Sequence[int]) -> int:
        """One pass; the argmax after the last token only (drafting needs no other row)."""
        if len(tokens) > 1:
            self.advance(tokens[:-1])
        return int(self.forward_argmax(tokens[-1:])[0])

    def forward_last_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """One pass; the next-token logits after the last token only (``[n_vocab]``)."""
        if len(tokens) > 1:
            self.advance(tokens[:-1])
        return self.forward_logits(tokens[-1:])[0]

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, ...)."""
        return False

    def close(self) -> None:
        """Free the engine's resources; safe to call twice."""
        return None


def check_tokens(tokens: Sequence[int], n_vocab: int, what: str = "token") -> None:
    """Raise ConfigError if any token id lies outside ``[0, n_vocab)``."""
    for t in tokens:
        if not 0 <= int(t) < n_vocab:
            raise ConfigError(f"{what} id {t} is outside the vocabulary [0, {n_vocab})")


@runtime_checkable
class DrafterEngine(Protocol):
    """What proposes tokens each round: a draft model or a model-free lookup.

    The decoder calls ``start`` once per generation, then each round ``propose``
    followed by ``accept`` with what the round committed. After an error it calls
    ``rollback`` so the drafter drops anything not committed.
    """

    name: str

    def start(self, prompt_tokens: Sequence[int]) -> None:
        """Begin a generation whose committed context is ``prompt_tokens``."""
        ...

    def propose(self, max_tokens: int, policy: VerificationPolicy,
                rng: np.random.Generator) -> DraftProposal:
        """Propose at most ``max_tokens`` tokens continuing the committed context (0 allowed)."""
        ...

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        """The round kept ``n_accepted`` drafted tokens and committed ``committed`` (accepted + target token)."""
        ...

    def rollback(self) -> None:
        """Drop any state beyond the committed context."""
        ...


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if len(diff) else n


def reusable_prefix(engine: SpeculativeEngine, tokens: Sequence[int]) -> int:
    """How many leading ``tokens`` the engine's cache already holds (0 if it can't tell).

    Reads the engine's own record of its cache (``engine.tokens``), so it stays right
    when several decoders share one engine.
    """
    cached = getattr(engine, "tokens", None)
    return common_prefix_length(cached, tokens) if cached is not None else 0
