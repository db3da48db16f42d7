"""Draft/target vocabulary compatibility: drafted ids must mean the same text to the target.

Follows llama.cpp's speculative check: same vocab type, same BOS/EOS and add-BOS/EOS
flags, sizes within ``MAX_SIZE_DIFFERENCE``, identical token text over the shared
range past the first ``SKIP_SPECIAL`` ids.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from .errors import VocabMismatchError

MAX_SIZE_DIFFERENCE = 128
SKIP_SPECIAL = 5


class VocabSource(Protocol):
    """What the check reads from an engine (LlamaCppEngine provides it)."""

    vocab_type: int
    bos_token: int
    eos_token: int
    add_bos: bool
    add_eos: bool
    n_vocab: int
    token_texts: Sequence[bytes]


def check_compatible(target: VocabSource, draft: VocabSource) -> None:
    """Raise VocabMismatchError naming the first difference between the two vocabularies."""
    for attr in ("vocab_type", "bos_token", "eos_token", "add_bos", "add_eos"):
        t, d = getattr(target, attr), getattr(draft, attr)
        if t != d:
            raise VocabMismatchError(f"draft and target differ in {attr}: target {t!r}, draft {d!r}")
    if abs(target.n_vocab - draft.n_vocab) > MAX_SIZE_DIFFERENCE:
        raise VocabMismatchError(
            f"vocabulary sizes differ by more than {MAX_SIZE_DIFFERENCE}: "
            f"target {target.n_vocab}, draft {draft.n_vocab}")
    target_texts, draft_texts = target.token_texts, draft.token_texts
    for i in range(SKIP_SPECIAL, min(target.n_vocab, draft.n_vocab)):
        if target_texts[i] != draft_texts[i]:
            raise VocabMismatchError(
                f"token {i} differs: target {_show(target_texts[i])}, draft {_show(draft_texts[i])}")


def _show(text: bytes) -> str:
    return repr(text.decode("utf-8", errors="replace"))
