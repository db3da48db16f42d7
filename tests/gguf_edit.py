"""Test helpers: copy a GGUF file with some metadata keys changed, added or removed; read what type a file is.

``rewrite`` is used by the hyperparameter tests to write well-formed files with absurd values; ``file_type`` and
``matrix_types`` by the tests of files requantized or written in a given type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

DROP = object()  # as a value in ``changes``: remove the key


def file_type(path: Path) -> int:
    """The file's ``general.file_type``: llama.cpp's LLAMA_FTYPE_MOSTLY_* (1 F16, 7 Q8_0, 15 Q4_K_M)."""
    return int(gguf.GGUFReader(str(path)).fields["general.file_type"].parts[-1][0])


def matrix_types(path: Path) -> dict[str, str]:
    """The tensor type of each of the file's matrices (2-D tensors), by tensor name."""
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors if len(t.shape) == 2}


def rewrite(source: Path, dest: Path, changes: dict[str, Any], types: dict[str, gguf.GGUFValueType] | None = None,
            tensor_shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    """Write ``dest``: ``source`` with ``changes`` applied to its keys (``DROP`` removes one).

    ``types`` gives the value type of a new or retyped key (default: the old type, else UINT32
    for ints, FLOAT32 for floats, STRING for str). ``tensor_shapes`` overrides a tensor's recorded
    shape (GGUF order, fastest dimension first) while keeping its bytes.
    """
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dest), arch)
    types = types or {}
    seen = set()
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        seen.add(name)
        value = changes.get(name, field.contents())
        if value is DROP:
            continue
        vtype = types.get(name, field.types[0])
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    for name, value in changes.items():
        if name in seen or value is DROP:
            continue
        default = (gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.FLOAT32
                   if isinstance(value, float) else gguf.GGUFValueType.UINT32)
        writer.add_key_value(name, value, types.get(name, default))
    for t in reader.tensors:
        shape = (tensor_shapes or {}).get(t.name)
        raw_shape = list(reversed(shape)) if shape else list(reversed([int(d) for d in t.shape]))
        writer.add_tensor(t.name, t.data, raw_shape=raw_shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest
