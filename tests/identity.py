"""Greedy identity on llama.cpp, with its condition stated.

The decoder is exact with respect to the logits it is given, but llama.cpp computes a
pass over several tokens with other kernels than a one-token pass, so the logits differ
in the last bits (up to 2e-3 on the tiny F32 family, measured over passes of 2-17 tokens).
A speculative run can therefore flip the target's choice where its two best logits are
that close. What the tests can promise:

- up to the first *near-tie* of plain decoding (top-2 logit margin below ``NEAR_TIE``, read
  from the target's logits in a one-token plain pass), speculative output is token for
  token plain decoding's output;
- beyond it, identity holds only where exact mode's load-time self-test says this build
  and model are batch-invariant (``strict_identity``; an engine loaded with ``exact=True``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

NEAR_TIE = 0.02  # ten times the largest batched vs one-token logit difference measured on the tiny family
MIN_COMPARED = 10  # a comparison over fewer tokens than this proves too little: choose another prompt


@dataclass(frozen=True)
class PlainReference:
    """Plain greedy decoding through one-token passes, with each choice's top-2 margin."""

    tokens: list[int]
    margins: list[float]  # top-1 minus top-2 logit of the pass that chose tokens[i]

    @property
    def comparable(self) -> int:
        """Tokens before the first near-tie: speculative output must equal these."""
        return next((i for i, m in enumerate(self.margins) if m < NEAR_TIE), len(self.tokens))


def plain_reference(engine, prompt: Sequence[int], max_tokens: int, *, ignore_eog: bool = False) -> PlainReference:
    """Decode ``max_tokens`` greedily, one token per pass (as plain decoding does), recording margins.

    Stops before an end-of-generation token unless ``ignore_eog``, as the decoder does.
    Leaves the engine holding the prompt and the output.
    """
    engine.reset(0)
    engine.advance(list(prompt[:-1]))
    last, tokens, margins = int(prompt[-1]), [], []
    for _ in range(max_tokens):
        logits = engine.forward_logits([last])[0]  # [V], one-token pass
        top2 = np.partition(logits, len(logits) - 2)[-2:]
        last = int(np.argmax(logits))
        if not ignore_eog and engine.is_eog(last):
            break
        tokens.append(last)
        margins.append(float(top2[1] - top2[0]))
    return PlainReference(tokens, margins)


def strict_identity(engine) -> bool:
    """Whether exact mode's load-time self-test found this build and model batch-invariant
    (``engine.exactness``, docs/exactness.md). Engines loaded without exact mode have no
    verdict: identity is then asserted only up to the first near-tie."""
    return engine.exactness is not None and engine.exactness.invariant


def assert_matches_plain(tokens: Sequence[int], reference: PlainReference, *, strict: bool = False,
                         min_compared: int = MIN_COMPARED) -> int:
    """Assert ``tokens`` equal plain decoding's up to its first near-tie (all of them when ``strict``).

    Returns how many tokens were compared. Fails if that is fewer than ``min_compared``,
    so a prompt whose first choice is already a near-tie cannot pass vacuously.
    """
    tokens = list(tokens)
    if strict:
        assert tokens == reference.tokens
        return len(tokens)
    n = reference.comparable
    assert n >= min(min_compared, len(reference.tokens)), (
        f"plain decoding hits a near-tie (margin < {NEAR_TIE}) at token {n}: too early to compare; "
        f"margins {reference.margins[:n + 1]}")
    if tokens[:n] != reference.tokens[:n]:
        first = next((i for i in range(min(n, len(tokens))) if tokens[i] != reference.tokens[i]), len(tokens))
        raise AssertionError(f"output differs from plain decoding at token {first}, before plain decoding's "
                             f"first near-tie (token {n}, margin < {NEAR_TIE}): {tokens[:n]} != {reference.tokens[:n]}")
    if n == len(reference.tokens):
        assert tokens == reference.tokens  # no near-tie at all: the whole output must agree
    return n
