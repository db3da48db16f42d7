"""Run by tests/test_fuzz_header.py in a child process: load many corrupted GGUF files.

``bytes`` mode flips random bytes of the header; ``hparams`` mode writes well-formed files
whose hyperparameters (and tensor shapes) are absurd: zero, huge, negative, NaN, the wrong
type, or missing. Prints "case N ..." before each load so a crash names the case that caused
it; prints "unexpected ..." for any error that is not an EngineError.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

from gguf_edit import DROP, rewrite
from specdec_gguf import EngineError
from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.modelfile import read_header

U = gguf.GGUFValueType
KEYS = ["block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.dimension_count",
        "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.freq_base", "rope.scaling.factor",
        "expert_count", "expert_used_count", "expert_group_count", "expert_group_used_count", "vocab_size",
        "attention.sliding_window", "expert_shared_count", "leading_dense_block_count", "nextn_predict_layers"]
INTS = [0, 1, 2, 3, 5, 7, 16, 63, 64, 65, 128, 511, 512, 513, 1024, 1025, 2**31 - 1, 2**31, 2**32 - 1]
FLOATS = [float("nan"), float("inf"), float("-inf"), -1.0, -1e-9, 0.0, -0.0, 1e-30, 1.0, 1e30, 3e38]
SHAPES = {"token_embd.weight": [(32, 733), (64, 700), (64, 800), (65, 733)],
          "output.weight": [(64, 1), (64, 732)], "output_norm.weight": [(32,), (128,)],
          "blk.0.attn_q.weight": [(64, 32), (32, 64), (64, 128)], "blk.0.ffn_up.weight": [(64, 64), (128, 128)]}


def hparam_mutation(rng: np.random.Generator) -> tuple[dict, dict, dict]:
    changes, types, shapes = {}, {}, {}
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 10))
        key = "llama." + KEYS[int(rng.integers(len(KEYS)))]
        if kind < 5:
            changes[key] = INTS[int(rng.integers(len(INTS)))]
            types[key] = U.UINT32
        elif kind == 5:
            changes[key], types[key] = [-1, -2**31][int(rng.integers(2))], U.INT32
        elif kind == 6:
            changes[key], types[key] = [2**40, 0, 2**64 - 1][int(rng.integers(3))], U.UINT64
        elif kind == 7:
            changes[key], types[key] = FLOATS[int(rng.integers(len(FLOATS)))], U.FLOAT32
        elif kind == 8:
            changes[key] = DROP if rng.random() < 0.5 else "x"
            if changes[key] == "x":
                types[key] = U.STRING
            if rng.random() < 0.3:
                changes["llama.rope.scaling.type"] = ["bogus", "yarn", ""][int(rng.integers(3))]
                types["llama.rope.scaling.type"] = U.STRING
        else:
            name = list(SHAPES)[int(rng.integers(len(SHAPES)))]
            shapes[name] = SHAPES[name][int(rng.integers(len(SHAPES[name])))]
    return changes, types, shapes


def main(mode: str, source: str, workdir: str, cases: int, seed: int) -> None:
    data = bytearray(Path(source).read_bytes())
    header_end = read_header(Path(source)).tensors[0].data_offset  # KV section + tensor infos
    rng = np.random.default_rng(seed)
    path = Path(workdir) / "fuzzed.gguf"
    loaded = rejected = 0
    for case in range(cases):
        if mode == "bytes":
            mutated = bytearray(data)
            for _ in range(int(rng.integers(1, 6))):
                mutated[int(rng.integers(0, header_end))] = int(rng.integers(0, 256))
            path.write_bytes(mutated)
            print(f"case {case}", flush=True)
        else:
            changes, types, shapes = hparam_mutation(rng)
            print(f"case {case} {changes} {shapes}", flush=True)
            rewrite(Path(source), path, changes, types, shapes)
        try:
            LlamaCppEngine(path, n_ctx=64, n_batch=16).close()
            loaded += 1
        except EngineError:
            rejected += 1
        except Exception as err:  # noqa: BLE001 - the test wants to see any other kind
            print(f"unexpected {type(err).__name__}: {err}", flush=True)
    print(f"done loaded={loaded} rejected={rejected}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
