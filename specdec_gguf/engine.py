"""The engine protocols: what the decoder needs from a model, and what text front-ends need beyond it.

An engine owns one sequence's KV cache. ``n_past`` is the number of tokens in that
cache and the rollback anchor: every forward call appends its tokens, and the
decoder calls :meth:`SpeculativeEngine.reset` to drop what it rejected.

Buffer ownership: an array returned by a ``forward_*`` call is valid until the next
call on the same engine (engines return views of their own buffers where they can).
A caller that keeps one past that copies it. ``InMemoryEngine`` reuses one buffer,
so tests catch code that keeps a view too long.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Protocol, Sequence, TypeGuard, runtime_checkable

import numpy as np

from .errors import ConfigError, EngineError

if TYPE_CHECKING:
    from .attention import AttentionChoice
    from .exactness import Exactness
    from .proposal import DraftProposal, VerificationPolicy
    from .schedule import DraftBudget


@runtime_checkable
class SpeculativeEngine(Protocol):
    """One model with one sequence's KV cache, as the decoder sees it."""

    @property
    def n_ctx(self) -> int:
        """Capacity of the KV cache in tokens."""
        ...

    @property
    def n_vocab(self) -> int:
        """Number of entries in a logits row (token ids are ``[0, n_vocab)``)."""
        ...

    @property
    def n_past(self) -> int:
        """Tokens currently committed to the KV cache."""
        ...

    @property
    def tokens(self) -> Sequence[int]:
        """The engine's own record of the tokens in its cache (``len == n_past``), for prefix reuse."""
        ...

    def reset(self, n_past: int) -> None:
        """Roll back so exactly ``n_past`` tokens remain; raises RollbackUnsupportedError if it can't."""
        ...

    def advance(self, tokens: Sequence[int]) -> None:
        """Prefill ``tokens`` without materializing logits."""
        ...

    def forward_argmax(self, tokens: Sequence[int]) -> np.ndarray:
        """One pass; the argmax of the next-token logits at each input position (int32 ``[n]``).

        Valid until the next call on this engine.
        """
        ...

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """One pass; the next-token logits at each input position (float32 ``[n, n_vocab]``).

        Valid until the next call on this engine.
        """
        ...

    def forward_proposal(self, anchor: int, proposal: DraftProposal, *, greedy: bool) -> np.ndarray:
        """Verify ``[anchor] + proposal.tokens`` in one pass.

        Greedy returns argmax ids ``[k + 1]``; sampling returns logits ``[k + 1, n_vocab]``.
        Valid until the next call on this engine.
        """
        ...

    def forward_last_argmax(self, tokens: Sequence[int]) -> int:
        """One pass; the argmax after the last token only (drafting needs no other row)."""
        ...

    def forward_last_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """One pass; the next-token logits after the last token only (``[n_vocab]``).

        Valid until the next call on this engine.
        """
        ...

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT, ...)."""
        ...

    def close(self) -> None:
        """Free the engine's resources; safe to call twice. Any later call raises EngineError."""
        ...


class EngineBase:
    """Shared defaults for engines: the linear ``forward_proposal``, one-row passes built from
    ``advance`` + a one-token forward, no end-of-generation tokens, context-manager support."""

    def forward_proposal(self, anchor: int, proposal: DraftProposal, *, greedy: bool) -> np.ndarray:
        tokens = [anchor, *proposal.tokens]
        return self.forward_argmax(tokens) if greedy else self.forward_logits(tokens)  # type: ignore[attr-defined]

    def forward_last_argmax(self, tokens: Sequence[int]) -> int:
        return int(self._advance_then(tokens, self.forward_argmax)[0])  # type: ignore[attr-defined]

    def forward_last_logits(self, tokens: Sequence[int]) -> np.ndarray:
        return self._advance_then(tokens, self.forward_logits)[0]  # type: ignore[attr-defined]

    def _advance_then(self, tokens: Sequence[int], forward) -> np.ndarray:
        """``advance(tokens[:-1])`` then ``forward(tokens[-1:])``, as one call: on failure the cache is as before."""
        if len(tokens) == 0:
            raise EngineError("forward_last_* needs at least one token")
        start = self.n_past  # type: ignore[attr-defined]
        if len(tokens) > 1:
            self.advance(tokens[:-1])  # type: ignore[attr-defined]
        try:
            return forward(tokens[-1:])
        except BaseException:
            if self.n_past > start:  # type: ignore[attr-defined]
                self.reset(start)  # type: ignore[attr-defined]
            raise

    def is_eog(self, token: int) -> bool:
        return False

    def close(self) -> None:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@runtime_checkable
class TextModel(SpeculativeEngine, Protocol):
    """A loaded GGUF model as the CLI, batch runner and server use it: the engine protocol plus text.

    ``LlamaCppEngine`` and ``ProcessEngine`` implement it; ``open_engine`` returns one.
    """

    model_path: object  # pathlib.Path
    architecture: str
    exactness: Exactness | None  # exact mode's self-test verdict (docs/exactness.md); None when exact mode is off
    attention: AttentionChoice | None  # flash attention as flash_attn="auto" timed it on a CPU; None: not timed

    @property
    def decode_seconds(self) -> float:
        """Seconds spent inside llama.cpp's decode so far (for overhead figures)."""
        ...

    @property
    def chat_template(self) -> str | None:
        """The Jinja chat template stored in the file (``tokenizer.chat_template``), or None."""
        ...

    @property
    def profile_key(self) -> str:
        """What decides this engine's speed (model file, threads, batch settings, build, device):
        the key its cost profile is cached under."""
        ...

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Text -> token ids; ``add_bos`` adds BOS where the model wants it; ``special`` parses special tokens."""
        ...

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The bytes one token stands for (may be part of a UTF-8 character)."""
        ...

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """Token ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
        ...

    def format_chat(self, user_text: str) -> str:
        """``user_text`` as one user turn in the model's chat template, ready for the reply."""
        ...

    # What the draft/target vocabulary check reads (see vocab.py).
    @property
    def vocab_type(self) -> int: ...

    @property
    def bos_token(self) -> int: ...

    @property
    def eos_token(self) -> int: ...

    @property
    def add_bos(self) -> bool: ...

    @property
    def add_eos(self) -> bool: ...

    @property
    def token_texts(self) -> Sequence[bytes]:
        """Every token's text, by id."""
        ...


# TextModel's members: its annotated attributes and its methods and properties, with SpeculativeEngine's.
_TEXT_MODEL_MEMBERS = frozenset(
    {name for cls in TextModel.__mro__ if cls not in (Protocol, object) for name in getattr(cls, "__annotations__", {})}
    | {name for name in dir(TextModel) if not name.startswith("_")})
_MISSING = object()


def is_text_model(engine: object) -> TypeGuard[TextModel]:
    """``isinstance(engine, TextModel)`` without reading its properties. Before Python 3.12 the protocol check
    calls ``hasattr`` on each member, which runs a property: a llama.cpp engine's ``token_texts`` read every
    token's text, 0.11 s of each decoder's construction on Gemma 3 270M (262,144 tokens) though only a draft
    model's vocabulary check needs them; a process engine's, 0.24 s over its pipe. This looks each member up
    statically, as Python 3.12's check does."""
    return all(inspect.getattr_static(engine, name, _MISSING) is not _MISSING for name in _TEXT_MODEL_MEMBERS)


def token_array(tokens: Sequence[int], n_vocab: int, what: str = "token") -> np.ndarray:
    """``tokens`` as int32 ids, or EngineError naming the first id outside ``[0, n_vocab)``.

    Engines call this before a backend sees the ids: llama.cpp aborts on some bad ids,
    and ids past int32 would otherwise wrap or overflow inside numpy.
    """
    try:
        ids = np.asarray(tokens)
    except (TypeError, ValueError, OverflowError):
        ids = np.asarray(tokens, dtype=object)
    if ids.size == 0:
        return np.empty(0, dtype=np.int32)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        if ids.ndim == 1 and ids.dtype == object and all(isinstance(t, int) for t in ids):
            bad = next(t for t in ids if not 0 <= t < n_vocab)  # ints past int64
            raise EngineError(f"{what} id {bad} is outside the vocabulary [0, {n_vocab})")
        raise EngineError(f"{what} ids must be a flat sequence of integers, got {np.asarray(tokens, dtype=object)!r}")
    if int(ids.min()) < 0 or int(ids.max()) >= n_vocab:
        bad = int(ids[(ids < 0) | (ids >= n_vocab)][0])
        raise EngineError(f"{what} id {bad} is outside the vocabulary [0, {n_vocab})")
    return ids.astype(np.int32, copy=False)


def argmax_ids(logits: np.ndarray, what: str, first_position: int = 0) -> np.ndarray:
    """Row-wise argmax of logits ``[n, V]`` (int32 ``[n]``); EngineError where a row is not finite.

    NaN and +inf win numpy's argmax (and an all -inf row picks a -inf), so checking the n picked
    values finds a broken row without another pass over the vocabulary.
    """
    ids = np.argmax(logits, axis=-1)
    picked = logits[np.arange(len(ids)), ids] if logits.ndim == 2 else logits[ids]
    if not np.isfinite(picked).all():
        row = int(np.flatnonzero(~np.isfinite(np.atleast_1d(picked)))[0])
        raise EngineError(f"{what}: the model produced non-finite logits (NaN or infinity) at position "
                          f"{first_position + row}; its weights or the backend are broken")
    return ids.astype(np.int32, copy=False)


def check_tokens(tokens: Sequence[int], n_vocab: int, what: str = "token") -> None:
    """Raise ConfigError if any token id lies outside ``[0, n_vocab)``."""
    for t in tokens:
        if not 0 <= int(t) < n_vocab:
            raise ConfigError(f"{what} id {t} is outside the vocabulary [0, {n_vocab})")


@runtime_checkable
class DrafterEngine(Protocol):
    """What proposes tokens each round: a draft model or a model-free lookup.

    The decoder calls ``check_target`` once when it is built, ``start`` once per
    generation, then each round ``propose`` followed by ``accept`` with what the round
    committed. After an error it calls ``rollback`` so the drafter drops anything not
    committed.
    """

    name: str

    @property
    def cost_engine(self) -> SpeculativeEngine | None:
        """The engine whose passes drafting costs (a draft model's), or None when drafting is free."""
        ...

    @property
    def max_catch_up(self) -> int | None:
        """Most committed tokens a proposal's first pass takes in after plain steps (a draft model
        restarts its view on the latest ones beyond); None: all. The schedule prices a look with it."""
        ...

    def acceptance_priors(self, greedy: bool) -> Sequence[float]:
        """Prior acceptance chance per confidence bucket (see confidence.py); empty: no buckets,
        the schedule then estimates acceptance per draft slot."""
        ...

    def check_target(self, target: SpeculativeEngine) -> None:
        """Raise VocabMismatchError if this drafter's token ids would mean other text to ``target``."""
        ...

    def start(self, prompt_tokens: Sequence[int]) -> None:
        """Begin a generation whose committed context is ``prompt_tokens``."""
        ...

    def propose(self, max_tokens: int, policy: VerificationPolicy, rng: np.random.Generator,
                budget: DraftBudget | None = None) -> DraftProposal:
        """Propose at most ``max_tokens`` tokens continuing the committed context (0 allowed).

        With a ``budget`` (the adaptive schedule's), label each token with its confidence bucket
        and a drafter that pays per token stops when ``budget.keep_drafting`` says more can't pay.
        """
        ...

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        """The round kept ``n_accepted`` drafted tokens and committed ``committed`` (accepted + target token).
        After plain rounds the drafter was not asked about (a pause), ``committed`` holds all their tokens
        at once, with ``n_accepted`` 0."""
        ...

    def rollback(self) -> None:
        """Drop any state beyond the committed context."""
        ...


class DrafterBase:
    """Shared defaults for drafters: free to run, no confidence buckets, no vocabulary of their own
    to check, nothing to roll back."""

    cost_engine: SpeculativeEngine | None = None
    max_catch_up: int | None = None

    def acceptance_priors(self, greedy: bool) -> Sequence[float]:
        return ()

    def check_target(self, target: SpeculativeEngine) -> None:
        return None  # proposes ids taken from the target's own context

    def rollback(self) -> None:
        return None


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if len(diff) else n


def reusable_prefix(engine: SpeculativeEngine, tokens: Sequence[int]) -> int:
    """How many leading ``tokens`` the engine's cache already holds.

    Reads the engine's own record of its cache (``engine.tokens``), so it stays right
    when several decoders share one engine.
    """
    return common_prefix_length(engine.tokens, tokens)
