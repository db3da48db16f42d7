"""PromptLookupDrafter: model-free n-gram lookup over the prompt and the generated text."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..engine import DrafterBase
from ..errors import ConfigError
from ..proposal import DraftProposal, VerificationPolicy


class PromptLookupDrafter(DrafterBase):
    """Propose the tokens that followed the most recent earlier occurrence of the context's tail.

    Tries the longest n-gram first (``max_ngram`` down to ``min_ngram``). An index
    from n-gram to the position after its latest occurrence is updated as tokens are
    committed, so a step costs O(max_ngram), not a rescan of the context.
    ``num_pred_tokens`` caps a proposal (None: the decoder's k decides).
    The proposal is deterministic, so q is one-hot.
    """

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_pred_tokens: int | None = None) -> None:
        if not isinstance(min_ngram, int) or min_ngram < 1:
            raise ConfigError(f"min_ngram={min_ngram!r} must be an integer >= 1")
        if not isinstance(max_ngram, int) or max_ngram < min_ngram:
            raise ConfigError(f"max_ngram={max_ngram!r} must be an integer >= min_ngram={min_ngram}")
        if num_pred_tokens is not None and (not isinstance(num_pred_tokens, int) or num_pred_tokens < 1):
            raise ConfigError(f"num_pred_tokens={num_pred_tokens!r} must be an integer >= 1 or None")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_pred_tokens = num_pred_tokens
        self._context: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}

    def start(self, prompt_tokens: Sequence[int]) -> None:
        self._context = []
        self._index = {}
        self._extend(prompt_tokens)

    def propose(self, max_tokens: int, policy: VerificationPolicy | None = None,
                rng: np.random.Generator | None = None) -> DraftProposal:
        if self.num_pred_tokens is not None:
            max_tokens = min(max_tokens, self.num_pred_tokens)
        ctx = self._context
        if max_tokens <= 0:
            return DraftProposal()
        for n in range(min(self.max_ngram, len(ctx)), self.min_ngram - 1, -1):
            start = self._index.get(tuple(ctx[-n:]))
            if start is not None:
                return DraftProposal(tokens=tuple(ctx[start:start + max_tokens]))
        return DraftProposal()

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self._extend(committed)

    def _extend(self, tokens: Sequence[int]) -> None:
        ctx, index = self._context, self._index
        for token in tokens:
            ctx.append(int(token))
            end = len(ctx) - 1
            # Register the n-grams ending just before the new token: their continuation now exists.
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n < 0:
                    break
                index[tuple(ctx[end - n:end])] = end
