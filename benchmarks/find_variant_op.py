"""Name the op that makes batched passes differ from one-token passes (for docs/exactness.md).

    python benchmarks/find_variant_op.py MODEL.gguf [--default-settings] [--flash-attn] [--window 9]

Runs a window of tokens one at a time and then in one pass, with ggml's eval callback
recording every F32 tensor, and prints, per position, the first tensor that is not
bit-identical: its op and its sources' types. Exact mode's settings (no repacking, no
flash attention, GGML_CPU_TILED_MM=0) apply unless --default-settings is given. Run
it with the interpreter whose llama.cpp build you want to examine.
"""

from __future__ import annotations

import argparse
from collections import Counter

from specdec_gguf.engines.llama_cpp.optrace import trace_window


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--default-settings", action="store_true", help="Repacking on, tiled matmul as is.")
    parser.add_argument("--flash-attn", action="store_true")
    parser.add_argument("--prefix", type=int, default=8)
    parser.add_argument("--window", type=int, default=9)
    parser.add_argument("-t", "--threads", type=int, default=2)
    args = parser.parse_args()
    result = trace_window(args.model, prefix=args.prefix, window=args.window, exact=not args.default_settings,
                          n_threads=args.threads, flash_attn=args.flash_attn)
    print(f"largest logit difference, one-token vs one pass of {args.window}: {result.max_logit_diff:.3g} "
          f"({result.tensors_compared} tensors compared)")
    if not result.differences:
        print("every compared tensor is bit-identical")
        return
    for d in result.differences:
        print(f"position {d.position}: {d.tensor} = {d.op}({', '.join(d.sources)}) differs by up to "
              f"{d.max_abs_diff:.3g}")
    ops = Counter(d.describe().split(" at ")[0] for d in result.differences)
    print("first differing op (count of positions): " + "; ".join(f"{op} x{n}" for op, n in ops.most_common()))

if __name__ == "__main__":
    main()
