"""Validated settings: how to load an engine and which drafter to use. The one place defaults live.

Every consumer (``LlamaCppEngine``, ``ProcessEngine``, TOML configs, ``specdec run``,
``batch``, ``bench``, ``demo``, ``serve``) builds these, so a bad value gets the same
message wherever it comes from and a default is decided once.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import ConfigError

DrafterKind = Literal["none", "draft-model", "prompt-lookup"]
SplitMode = Literal["none", "layer", "row"]
FlashAttn = Literal["auto", "on", "off"]
RollbackMode = Literal["auto", "seq_rm", "checkpoint"]
ExactMode = Literal["warn"]  # besides True/False: exact settings and the self-test, but no error

MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS: more aborts inside llama.cpp
MAX_NGRAM = 16  # longer n-grams never match more than 16 do, and the index grows with them
MAX_CATCH_UP = 128  # a draft model catches up on at most this many skipped tokens (AutoregressiveDrafter)
INT32_MAX = 2**31 - 1
MAX_DRAFT_TOKENS = 64  # no proposal longer than this pays on any engine we know of


def default_num_draft_tokens(kind: DrafterKind, adaptive: bool) -> int:
    """The draft length bound when none is given: an upper bound for adaptive, the k for fixed.

    Adaptive drafting only drafts what pays, so its bound is generous (lookup drafts are free
    to make, draft-model tokens are not); a fixed k drafts every round, so it stays short.
    """
    if not adaptive:
        return 4
    return 64 if kind == "prompt-lookup" else 8


def interpreter_path(value: str | os.PathLike[str]) -> Path:
    """An interpreter as given: a bare name (``python3.12``) is looked up on PATH when it is started;
    anything with a slash is a path, made absolute here (``Path("./py")`` would print as ``py`` and be
    looked up on PATH). Symlinks are kept: a venv's ``bin/python`` is one, and its location matters."""
    text = os.fspath(value)
    if os.sep in text or (os.altsep and os.altsep in text) or text.startswith("~"):
        return Path(os.path.abspath(os.path.expanduser(text)))
    return Path(text)


def _check_literal(cls: type, name: str, value: Any) -> None:
    allowed = typing.get_args(typing.get_type_hints(cls)[name])
    allowed = [a for a in allowed if a is not type(None)]
    if allowed and all(isinstance(a, str) for a in allowed) and value not in allowed:
        raise ConfigError(f"{name}={value!r} must be one of {allowed}")


def _check_int(name: str, value: Any, lo: int, hi: int | None = None, *, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        span = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ConfigError(f"{name}={value!r} must be an integer {span}" + (" or None" if none_ok else ""))


@dataclass(frozen=True)
class EngineSettings:
    """How to load one model (target or draft): placement, threads, memory.

    ``n_ctx`` 0 takes the model's trained context; ``n_threads`` None uses every core;
    ``devices`` names ggml devices (``specdec backends`` lists them, e.g. ``["CUDA0"]``);
    ``rpc_servers`` are llama.cpp RPC servers ``host:port`` (GGML_RPC builds); ``python``
    runs the engine in that interpreter (another llama.cpp build). ``exact`` True loads with
    the batch-invariant settings, self-tests at load and raises ExactnessError unless one-token
    and batched passes give bit-identical logits; ``"warn"`` does the same but only records the
    verdict (``engine.exactness``); see docs/exactness.md.
    """

    model: Path
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int | None = None
    n_gpu_layers: int = 0
    main_gpu: int = 0
    split_mode: SplitMode = "layer"
    tensor_split: list[float] | None = None
    n_threads: int | None = None
    n_threads_batch: int | None = None
    use_mmap: bool = True
    flash_attn: FlashAttn = "auto"
    rollback: RollbackMode = "auto"
    devices: list[str] | None = None
    rpc_servers: list[str] | None = None
    python: Path | None = None
    exact: bool | ExactMode = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        # llama.cpp takes these as 32-bit C ints; ctypes would wrap larger ones silently.
        _check_int("n_ctx", self.n_ctx, 0, INT32_MAX)
        _check_int("n_batch", self.n_batch, 1, INT32_MAX)
        _check_int("n_ubatch", self.n_ubatch, 1, INT32_MAX, none_ok=True)
        _check_int("n_gpu_layers", self.n_gpu_layers, -1, INT32_MAX)
        _check_int("main_gpu", self.main_gpu, 0, INT32_MAX)
        _check_int("n_threads", self.n_threads, 1, MAX_THREADS, none_ok=True)
        _check_int("n_threads_batch", self.n_threads_batch, 1, MAX_THREADS, none_ok=True)
        for name in ("split_mode", "flash_attn", "rollback"):
            _check_literal(EngineSettings, name, getattr(self, name))
        if self.tensor_split is not None and not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in self.tensor_split):
            raise ConfigError(f"tensor_split={self.tensor_split!r} must be a list of finite numbers >= 0")
        for name in ("devices", "rpc_servers"):
            value = getattr(self, name)
            if value is not None and not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"{name}={value!r} must be a list of non-empty strings")
        if self.python is not None:
            object.__setattr__(self, "python", interpreter_path(self.python))
        if not (isinstance(self.exact, bool) or self.exact == "warn"):
            raise ConfigError(f"exact={self.exact!r} must be true, false or 'warn'")
        if self.exact and self.flash_attn == "on":
            raise ConfigError("exact mode turns flash attention off (its one-token and batched kernels differ); "
                              "use flash_attn='auto' or 'off' with exact")

    def engine_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ``LlamaCppEngine`` takes (everything but ``model`` and ``python``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("model", "python")}
        out["rpc_servers"] = tuple(self.rpc_servers or ())
        return out


@dataclass(frozen=True)
class DrafterSettings:
    """Which drafter proposes tokens, and how many per round.

    ``num_draft_tokens`` None takes :func:`default_num_draft_tokens` (see ``max_draft_tokens``);
    ``draft_min`` > 0 skips verifying proposals shorter than it (a plain step instead), as
    llama.cpp's ``--draft-min`` does (greedy, or prompt lookup: a draft model's sampled
    proposals are verified whole, see SpeculativeDecoder).
    """

    kind: DrafterKind = "none"
    num_draft_tokens: int | None = None
    draft_min: int = 0
    adaptive: bool = True
    p_min: float = 0.0
    ngram_max: int = 3
    ngram_min: int = 1

    def __post_init__(self) -> None:
        _check_literal(DrafterSettings, "kind", self.kind)
        _check_int("num_draft_tokens", self.num_draft_tokens, 1, MAX_DRAFT_TOKENS, none_ok=True)
        _check_int("draft_min", self.draft_min, 0, MAX_DRAFT_TOKENS)
        if self.draft_min > self.max_draft_tokens:
            raise ConfigError(f"draft_min={self.draft_min} must not exceed num_draft_tokens={self.max_draft_tokens}")
        if not isinstance(self.adaptive, bool):
            raise ConfigError(f"adaptive={self.adaptive!r} must be true or false")
        if isinstance(self.p_min, bool) or not isinstance(self.p_min, (int, float)) or not 0.0 <= self.p_min < 1.0:
            raise ConfigError(f"p_min={self.p_min!r} must be a number in [0, 1)")
        _check_int("ngram_min", self.ngram_min, 1, MAX_NGRAM)
        _check_int("ngram_max", self.ngram_max, 1, MAX_NGRAM)
        if self.ngram_min > self.ngram_max:
            raise ConfigError(f"ngram_min={self.ngram_min}, ngram_max={self.ngram_max} must satisfy "
                              f"1 <= ngram_min <= ngram_max <= {MAX_NGRAM}")

    @property
    def max_draft_tokens(self) -> int:
        """The draft length bound in force: the given one, or the default for this kind and mode."""
        if self.num_draft_tokens is not None:
            return self.num_draft_tokens
        return default_num_draft_tokens(self.kind, self.adaptive)

    def resolved(self) -> dict[str, Any]:
        """Every field with the defaults filled in (for --json and results files)."""
        return {**dataclasses.asdict(self), "num_draft_tokens": self.max_draft_tokens}
