"""Write a draft model made of a real model's first blocks: the target's own embedding, its first N blocks and
its output layer (early exit), so the draft is a trained language model whose confidence means something.

Usage: python benchmarks/layer_draft.py TARGET.gguf --blocks N --out DRAFT.gguf

The tiny random families' drafts are underconfident (their probabilities say little about which tokens the
target keeps), and no small instruct model ships with this repository; an early exit of Gemma 3 270M is the
stand-in for a real draft. Its first 12 of 18 blocks agree with the whole model on 40%-95% of greedy tokens per
prompt of the default set, and its top probability is calibrated (tokens drafted at 0.9 or more kept 95%-97% of
the time, at 0.1-0.2 12%-20%). It costs most of a target pass (Gemma's output layer, its 262k-token vocabulary, is
most of the work), so drafting with it does not pay on a CPU: timed, a pair where plain decoding is the optimum;
replayed at a cheap draft's price (benchmarks/judge.py), a real draft's confidence where drafting pays.
Tensors are copied byte for byte (the file's quantization kept); the file appears whole or not at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.errors import ConfigError  # noqa: E402
from specdec_gguf.modelfile import block_of, written_whole  # noqa: E402

# Gemma 3 270M's draft in judge.py's recordings and matrix.py's gemma-l12-draft case: its first 12 of 18 blocks
GEMMA_DRAFT_BLOCKS = 12


def write_layer_draft(source: str | Path, dest: str | Path, blocks: int) -> Path:
    """Write ``dest``: ``source`` cut to its first ``blocks`` blocks (1 to one less than it has), the
    architecture's per-block values cut with them, every other key and tensor as it is. Returns ``dest``."""
    source, dest = Path(source), Path(dest)
    if not source.is_file():
        raise ConfigError(f"no GGUF file at {source}")
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    if count_key not in reader.fields:
        raise ConfigError(f"{source} has no {count_key} key: not a model whose blocks can be cut")
    have = int(reader.fields[count_key].contents())
    if not 1 <= blocks < have:
        raise ConfigError(f"blocks={blocks!r} must be 1 to {have - 1} ({source} has {have} blocks)")
    kept = [t for t in reader.tensors if (block := block_of(t.name)) is None or block < blocks]
    with written_whole(dest) as partial:
        writer = gguf.GGUFWriter(str(partial), arch)
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue  # (the writer writes these itself)
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            value = field.contents()
            if name == count_key:
                value = blocks
            elif sub_type is not None and name.startswith(f"{arch}.") and len(value) == have:
                value = value[:blocks]  # (a value per block, as some architectures give head counts)
            writer.add_key_value(name, value, value_type, sub_type=sub_type)
        for t in kept:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in kept:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="the target's GGUF file")
    parser.add_argument("--blocks", type=int, required=True, help="how many of its first blocks the draft keeps")
    parser.add_argument("--out", type=Path, required=True, help="the draft's GGUF file")
    args = parser.parse_args(argv)
    try:
        print(write_layer_draft(args.model, args.out, args.blocks))
    except ConfigError as error:
        raise SystemExit(str(error)) from None


if __name__ == "__main__":
    main()
