"""Run by tests/test_fuzz_header.py in a child process: load many corrupted GGUF headers.

Prints "case N" before each load so a crash names the case that caused it; prints
"unexpected ..." for any error that is not an EngineError.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from specdec_gguf import EngineError
from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.modelfile import read_header


def main(source: str, workdir: str, cases: int, seed: int) -> None:
    data = bytearray(Path(source).read_bytes())
    header_end = read_header(Path(source)).tensors[0].data_offset  # KV section + tensor infos
    rng = np.random.default_rng(seed)
    path = Path(workdir) / "fuzzed.gguf"
    loaded = rejected = 0
    for case in range(cases):
        mutated = bytearray(data)
        for _ in range(int(rng.integers(1, 6))):
            mutated[int(rng.integers(0, header_end))] = int(rng.integers(0, 256))
        path.write_bytes(mutated)
        print(f"case {case}", flush=True)
        try:
            LlamaCppEngine(path, n_ctx=64, n_batch=16).close()
            loaded += 1
        except EngineError:
            rejected += 1
        except Exception as err:  # noqa: BLE001 - the test wants to see any other kind
            print(f"unexpected {type(err).__name__}: {err}", flush=True)
    print(f"done loaded={loaded} rejected={rejected}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
