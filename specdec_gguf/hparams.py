"""The hyperparameters in a GGUF header that llama.cpp trusts: checked before llama.cpp sees them.

A well-formed header can still hold absurd values. llama.cpp aborts the whole process on
some (``GGML_ASSERT``: ``block_count`` 0 or past its layer limit, a negative or NaN norm
epsilon, expert counts that contradict each other) and computes NaN on others (a rope
frequency of 0 or NaN). Each check below names the key, the value and what is allowed.
Values of the wrong type, missing optional keys and per-layer arrays are left to llama.cpp,
which refuses those with its own message.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from .errors import EngineError

MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # llama.cpp's LLAMA_MAX_EXPERTS (llama-cpp-python 0.3.36)
ROPE_SCALING = ("none", "linear", "yarn", "longrope")  # llama.cpp asserts on any other name
REQUIRED = ("block_count", "embedding_length", "context_length")  # every architecture's loader reads these


def _int(fields: Mapping[str, Any], key: str) -> int | None:
    value = fields.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_hparams(path: Path, fields: Mapping[str, Any], recurrent: bool) -> None:
    """Raise EngineError for a hyperparameter llama.cpp would abort on or turn into NaN logits.

    ``recurrent`` architectures (Mamba, RWKV, ...) legitimately have no attention heads.
    """
    arch = fields["general.architecture"]
    p = f"{arch}."

    def fail(reason: str) -> EngineError:
        return EngineError(f"{path}: invalid hyperparameter: {reason}")

    def need(key: str, value: int | None, lo: int, hi: int | None = None) -> int:
        if value is None or value < lo or (hi is not None and value > hi):
            span = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise fail(f"{key} = {fields.get(key)!r} must be an integer {span}")
        return value

    # An architecture llama.cpp doesn't know has none of its keys: its own message says so better.
    if any(key.startswith(p) for key in fields):
        for name in REQUIRED:
            if p + name not in fields:
                raise fail(f"the required key {p + name!r} is missing")
        need(p + "block_count", _int(fields, p + "block_count"), 1, MAX_LAYERS)
        need(p + "context_length", _int(fields, p + "context_length"), 1)
        n_embd = need(p + "embedding_length", _int(fields, p + "embedding_length"), 1)
    else:
        n_embd = None

    for key, value in fields.items():
        if key.startswith(p) and isinstance(value, float) and not math.isfinite(value):
            raise fail(f"{key} = {value!r} must be a finite number")
        if key.startswith(p) and key.endswith("epsilon") and isinstance(value, float) and value < 0:
            raise fail(f"{key} = {value!r} must be >= 0")
    base = fields.get(p + "rope.freq_base")
    if isinstance(base, float) and base <= 0:
        raise fail(f"{p}rope.freq_base = {base!r} must be > 0")
    scaling = fields.get(p + "rope.scaling.type")
    if isinstance(scaling, str) and scaling not in ROPE_SCALING:
        raise fail(f"{p}rope.scaling.type = {scaling!r} must be one of {list(ROPE_SCALING)}")
    nextn = _int(fields, p + "nextn_predict_layers")
    layers = _int(fields, p + "block_count")
    if nextn is not None and layers is not None and not 0 <= nextn <= layers:
        raise fail(f"{p}nextn_predict_layers = {nextn} must lie in [0, block_count = {layers}]")

    experts = _int(fields, p + "expert_count") or 0
    used = _int(fields, p + "expert_used_count") or 0
    groups = _int(fields, p + "expert_group_count") or 0
    groups_used = _int(fields, p + "expert_group_used_count") or 0
    need(p + "expert_count", experts, 0, MAX_EXPERTS)
    if experts == 0 and (used or groups):
        raise fail(f"{p}expert_used_count = {used} / expert_group_count = {groups} without experts "
                   f"({p}expert_count = 0): both must be 0")
    if experts:
        need(p + "expert_used_count", used, 1, experts)
        if groups >= experts:
            raise fail(f"{p}expert_group_count = {groups} must be < expert_count = {experts}")
        if groups > 1 and (experts % groups or not 0 < groups_used < groups):
            raise fail(f"{p}expert_group_count = {groups} must divide expert_count = {experts}, and "
                       f"expert_group_used_count = {groups_used} must lie in [1, {groups - 1}]")

    if recurrent:
        return
    heads = _int(fields, p + "attention.head_count")
    if heads is not None:
        need(p + "attention.head_count", heads, 1)
        kv = _int(fields, p + "attention.head_count_kv")
        if kv is not None and (kv < 1 or heads % kv):
            raise fail(f"{p}attention.head_count_kv = {kv} must be >= 1 and divide attention.head_count = {heads}")
        for key in ("attention.key_length", "attention.value_length"):
            if _int(fields, p + key) is not None:
                need(p + key, _int(fields, p + key), 1)
        if n_embd is not None and p + "attention.key_length" not in fields and n_embd % heads:
            raise fail(f"{p}attention.head_count = {heads} must divide embedding_length = {n_embd} "
                       "(no attention.key_length is given)")
