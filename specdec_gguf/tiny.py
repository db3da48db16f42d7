"""Tiny random llama-architecture GGUF models, for tests, demos and docs.

The files have a real SentencePiece-style tokenizer section, so tokenize/detokenize
work, and are a few hundred KB. ``write_tiny_family`` writes a target and a draft
that share everything but depth: the draft is the target's first layers, and the
target's later layers write into the residual stream with a small ``gain``, so the
two agree on most greedy tokens (all of them at ``gain=0``).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import ConfigError
from .modelfile import block_of

_WORDS = (
    "the of and to in is was that for on with as by at from it an be this are or his had not but "
    "which have they you were her she there their one all we can has been if more when will would "
    "who so no out up into than them some could time these two may first then do any like my now "
    "over such our man me even most made after also did many before must through back years where "
    "much your way well down should because each just those people how too little state good very "
    "make world still own see men work long get here between both life being under never day same "
    "another know while last might us great old year off come since against go came right used take "
    "three def return class import self print value list data model token draft target speed fast"
).split()

# dtype -> (gguf file type, tensor type of the matrices); all of these gguf can write itself
DTYPES = {"f32": ("ALL_F32", None), "f16": ("MOSTLY_F16", "F16"), "q8_0": ("MOSTLY_Q8_0", "Q8_0"),
          "q4_0": ("MOSTLY_Q4_0", "Q4_0")}

EXTRA_TOKENS = 100  # appended by the "extended" vocabulary variant

# llama.cpp token types
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def tiny_vocab(variant: str = "default", special_tokens: Sequence[str] = ()) -> tuple[list[str], list[float], list[int]]:
    """Token texts, scores and types of the tiny SentencePiece vocabulary.

    ``special_tokens`` are appended as control tokens (what chat templates use, e.g.
    ``<|im_start|>``); llama.cpp tokenizes them only when asked to parse special tokens.

    ``variant="shuffled"`` gives the same size with different texts past the byte
    tokens (a deliberately incompatible vocabulary); ``"extended"`` appends
    ``EXTRA_TOKENS`` tokens to the default one (a draft vocabulary larger than the
    target's, which the compatibility check allows, as llama.cpp's does).
    """
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    pieces: list[str] = ["\u2581"] + list(string.ascii_letters + string.digits + string.punctuation)
    for word in _WORDS:
        marked = "\u2581" + word
        pieces.extend(marked[:n] for n in range(2, len(marked) + 1))
    seen: set[str] = set()
    unique = [p for p in pieces if not (p in seen or seen.add(p))]
    if variant == "shuffled":
        unique = unique[:1] + unique[1:][::-1]
    elif variant == "extended":
        unique += [f"\u2581extra{i}" for i in range(EXTRA_TOKENS)]
    elif variant != "default":
        raise ConfigError(f"vocab variant={variant!r} must be 'default', 'shuffled' or 'extended'")
    tokens += unique
    types += [_NORMAL] * len(unique)
    # Longer pieces score higher so merges build whole words.
    scores = [0.0] * 259 + [float(len(p)) - i * 1e-4 for i, p in enumerate(unique)]
    clash = sorted(set(special_tokens) & set(tokens))
    if clash or len(set(special_tokens)) != len(special_tokens):
        raise ConfigError(f"special_tokens={list(special_tokens)!r} must be distinct new texts (clash: {clash})")
    tokens += list(special_tokens)
    types += [_CONTROL] * len(special_tokens)
    scores += [0.0] * len(special_tokens)
    return tokens, scores, types


# ChatML, as Qwen and many fine-tunes ship it; `specdec tiny --chat` writes it into the tiny models.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class TinyShape:
    """Dimensions of a tiny model."""

    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 128
    n_ctx_train: int = 2048
    # Key/value heads (None: as many as query heads). Fewer share each one among several query heads
    # (grouped-query attention, as most released models do): a smaller KV cache to attend over.
    n_head_kv: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_embd", "n_head", "n_ff", "n_ctx_train"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        if self.n_embd % self.n_head:
            raise ConfigError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")
        kv = self.kv_heads
        if not 1 <= kv <= self.n_head or self.n_head % kv:
            raise ConfigError(f"n_head_kv={self.n_head_kv} must divide n_head={self.n_head}")

    @property
    def kv_heads(self) -> int:
        """The key/value heads (``n_head_kv``, or ``n_head`` where None)."""
        return self.n_head if self.n_head_kv is None else self.n_head_kv


def _random_weights(n_layers: int, n_vocab: int, shape: TinyShape, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    e, f = shape.n_embd, shape.n_ff
    kv = shape.kv_heads * (e // shape.n_head)  # rows of the key and value projections

    def w(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    weights = {
        "token_embd.weight": w(n_vocab, e, np.sqrt(e)),
        "output_norm.weight": np.ones(e, dtype=np.float32),
        "output.weight": w(n_vocab, e, 4.0),
    }
    for i in range(n_layers):
        p = f"blk.{i}."
        weights |= {
            p + "attn_norm.weight": np.ones(e, dtype=np.float32),
            p + "attn_q.weight": w(e, e, 1.0), p + "attn_k.weight": w(kv, e, 1.0),
            p + "attn_v.weight": w(kv, e, 1.0), p + "attn_output.weight": w(e, e, 1.0),
            p + "ffn_norm.weight": np.ones(e, dtype=np.float32),
            p + "ffn_gate.weight": w(f, e, 1.0), p + "ffn_up.weight": w(f, e, 1.0),
            p + "ffn_down.weight": w(e, f, 1.0),
        }
    return weights


def _write(path: Path, weights: dict[str, np.ndarray], n_layers: int, shape: TinyShape,
           dtype: str, vocab_variant: str, name: str, *, chat_template: str | None = None,
           special_tokens: Sequence[str] = ()) -> Path:
    import gguf  # the gguf writer is only needed here

    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} must be one of {sorted(DTYPES)}")
    file_type, qtype = DTYPES[dtype]
    tokens, scores, types = tiny_vocab(vocab_variant, special_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(getattr(gguf.LlamaFileType, file_type))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for tensor_name, data in weights.items():
        if qtype and data.ndim == 2:  # matrices in the file's type; norms stay F32
            q = getattr(gguf.GGMLQuantizationType, qtype)
            writer.add_tensor(tensor_name, gguf.quants.quantize(data, q), raw_dtype=q)
        else:
            writer.add_tensor(tensor_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_model(path: str | Path, *, n_layers: int = 4, seed: int = 0, dtype: str = "f32",
                     vocab_variant: str = "default", shape: TinyShape = TinyShape(),
                     chat_template: str | None = None, special_tokens: Sequence[str] = ()) -> Path:
    """Write one tiny random llama GGUF to ``path`` and return the path.

    ``chat_template`` (Jinja source) goes into ``tokenizer.chat_template``; ``special_tokens``
    are appended to the vocabulary as control tokens (the template's markers).
    """
    if n_layers < 1:
        raise ConfigError(f"n_layers={n_layers} must be >= 1")
    n_vocab = len(tiny_vocab(vocab_variant, special_tokens)[0])
    weights = _random_weights(n_layers, n_vocab, shape, seed)
    return _write(Path(path), weights, n_layers, shape, dtype, vocab_variant, f"tiny-{n_layers}L",
                  chat_template=chat_template, special_tokens=special_tokens)


@dataclass(frozen=True)
class TinyFamily:
    """Paths of a tiny target and a draft that share its vocabulary."""

    target: Path
    draft: Path

    def __iter__(self):
        return iter((self.target, self.draft))


def write_tiny_family(directory: str | Path, *, seed: int = 0, target_layers: int = 4,
                      draft_layers: int = 1, gain: float = 0.25, dtype: str = "f32",
                      shape: TinyShape = TinyShape(), chat_template: str | None = None,
                      special_tokens: Sequence[str] = ()) -> TinyFamily:
    """Write ``tiny-target.gguf`` and ``tiny-draft.gguf`` into ``directory``.

    ``chat_template`` and ``special_tokens`` go into both files (see :func:`write_tiny_model`).

    The draft is the target's first ``draft_layers`` layers; the target's later
    layers' output projections are scaled by ``gain``, so lower gain means more
    agreement (``gain=0``: the draft's greedy tokens are the target's).
    """
    if not 1 <= draft_layers < target_layers:
        raise ConfigError(f"draft_layers={draft_layers} must lie in [1, target_layers={target_layers})")
    if gain < 0:
        raise ConfigError(f"gain={gain} must be >= 0")
    directory = Path(directory)
    n_vocab = len(tiny_vocab("default", special_tokens)[0])
    weights = _random_weights(target_layers, n_vocab, shape, seed)
    for i in range(draft_layers, target_layers):
        for proj in ("attn_output", "ffn_down"):
            weights[f"blk.{i}.{proj}.weight"] = weights[f"blk.{i}.{proj}.weight"] * np.float32(gain)
    draft = {n: t for n, t in weights.items() if (block := block_of(n)) is None or block < draft_layers}
    return TinyFamily(
        target=_write(directory / "tiny-target.gguf", weights, target_layers, shape, dtype, "default",
                      f"tiny-target-{target_layers}L", chat_template=chat_template, special_tokens=special_tokens),
        draft=_write(directory / "tiny-draft.gguf", draft, draft_layers, shape, dtype, "default",
                     f"tiny-draft-{draft_layers}L", chat_template=chat_template, special_tokens=special_tokens),
    )


def write_incompatible_draft(path: str | Path, *, seed: int = 0, dtype: str = "f32") -> Path:
    """A tiny draft whose vocabulary differs from the family's (for error tests)."""
    return write_tiny_model(path, n_layers=1, seed=seed, dtype=dtype, vocab_variant="shuffled")
