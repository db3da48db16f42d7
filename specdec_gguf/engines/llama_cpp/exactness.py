"""Exact mode in llama.cpp: the settings that make passes batch-invariant, and the self-test at load.

The self-test compares the engine's own one-token and batched logits, bitwise, and every
intermediate tensor of the same passes (``optrace``): quantized models often round a
kernel's difference away before the logits in a short test, but not over a long generation.

What breaks batch invariance on CPU (docs/exactness.md has the details and files):
- llamafile's sgemm (``GGML_LLAMAFILE=ON``, the default build) takes matrix products over
  >= 2 tokens, ggml's dot products the one-token ones: another summation order. Only a
  build without it fixes that (``INVARIANT_BUILD``).
- the tiled K-quant matmul takes products over >= 8 tokens (Q2_K..Q6_K, IQ types): off
  with ``GGML_CPU_TILED_MM=0``, read once per process at the first such product.
- repacked weights (``use_extra_bufts``) use GEMM kernels for batches and GEMV for one token.
- flash attention: a one-token pass over >= 512 cached tokens splits the KV sum by thread,
  batched passes tile it. Exact mode turns it off.
"""

from __future__ import annotations

import os
from typing import Any

import llama_cpp as lc

from ...exactness import INVARIANT_BUILD, Exactness, compare_batched, probe_tokens
from .optrace import trace_model

TILED_ENV = "GGML_CPU_TILED_MM"
TILED_FORCE_ENV = "GGML_CPU_TILED_MM_FORCE"  # =1: the tiled kernel for every batch size, also invariant
PREFIX_TOKENS = 8  # KV length doesn't change results with exact settings (measured up to 600; docs/exactness.md)
WINDOW_TOKENS = 17  # [anchor] + 16 drafted tokens: the longest pass adaptive prompt lookup makes


class _ProcessState:
    """Whether llama.cpp computed anything in this process before exact mode set its environment."""

    computed = False  # set by the first LlamaCppEngine pass
    late = False  # exact mode came after a computation: GGML_CPU_TILED_MM was read already


def note_compute() -> None:
    """Called before a pass: the CPU backend reads its environment at the first product."""
    _ProcessState.computed = True


def tiled_invariant() -> bool:
    """Whether the environment makes the tiled K-quant matmul's use independent of the batch size."""
    return os.environ.get(TILED_ENV) == "0" or os.environ.get(TILED_FORCE_ENV) == "1"


def apply_environment() -> None:
    """Turn the tiled K-quant matmul off for this process (it is read once, at the first product),
    unless the environment already forces it on for every batch size. Respects an explicit setting."""
    if TILED_ENV not in os.environ and not tiled_invariant():
        if _ProcessState.computed:
            _ProcessState.late = True
        os.environ[TILED_ENV] = "0"


def llamafile_in_build() -> bool:
    """Whether this llama.cpp build has llamafile's sgemm (``LLAMAFILE = 1`` in its system info)."""
    info = lc.llama_print_system_info().decode("utf-8", errors="replace").replace(" ", "")
    return "LLAMAFILE=1" in info


def explain(differing_op: str | None, logits_differ: bool) -> list[str]:
    """Why the verdict is "not invariant", and the fix where one is known."""
    reasons = []
    if differing_op:
        reasons.append(f"{differing_op} differs between one-token and batched passes"
                       + ("" if logits_differ else " (rounded away before the logits in this test, not always)"))
    elif logits_differ:
        reasons.append("the logits differ (the op is not in the traced tensors: a fused or device kernel)")
    if llamafile_in_build():
        reasons.append(f"this build has llamafile's sgemm, which takes passes over >= 2 tokens: reinstall "
                       f"without it: {INVARIANT_BUILD}")
    if not tiled_invariant():
        reasons.append(f"{TILED_ENV}={os.environ.get(TILED_ENV)!r} keeps the K-quant tiled matmul for "
                       "passes over >= 8 tokens (exact mode needs 0)")
    elif _ProcessState.late:
        reasons.append(f"llama.cpp computed in this process before exact mode set {TILED_ENV}=0, which it "
                       "reads once (load exact-mode engines first, or set it in the environment)")
    return reasons


def self_test(engine: Any, llama_model: Any, *, threads: int, threads_batch: int, n_ubatch: int) -> Exactness:
    """The verdict for a freshly loaded ``engine`` (left empty): its own one-token vs batched logits, and
    every intermediate tensor of the same passes on a small tracing context of ``llama_model`` (its model)."""
    window = min(WINDOW_TOKENS, max(2, engine.n_ctx // 2))
    prefix = max(1, min(PREFIX_TOKENS, engine.n_ctx - window))
    bos = engine.bos_token
    tokens = probe_tokens(engine.n_vocab, prefix + window, first=bos if 0 <= bos < engine.n_vocab else None)
    comparison = compare_batched(engine, tokens[:prefix], tokens[prefix:])
    trace = trace_model(llama_model, n_threads=threads_batch, n_ubatch=n_ubatch, prefix=prefix, window=window)
    differing_op = trace.differences[0].describe() if trace.differences else None
    invariant = comparison.identical and differing_op is None
    reasons = () if invariant else tuple(explain(differing_op, not comparison.identical))
    report = {"flash_attn": "off", "use_extra_bufts": False, TILED_ENV: os.environ.get(TILED_ENV),
              TILED_FORCE_ENV: os.environ.get(TILED_FORCE_ENV), "n_threads": threads,
              "n_threads_batch": threads_batch, "llamafile_in_build": llamafile_in_build(),
              "tiled_env_read_before": _ProcessState.late, "llama_cpp_python": lc.__version__}
    return Exactness(invariant=invariant, comparison=comparison, differing_op=differing_op,
                     tensors_compared=trace.tensors_compared, reasons=reasons, settings=report)


def check_models(models: dict[str, str], n_threads: int | None = None) -> dict[str, dict[str, Any]]:
    """Exact mode's self-test on each model (label -> path): label -> verdict dict, or ``{"error": why}``.

    What ``specdec backends`` reports per interpreter (on tiny models of each type, and on
    models the user names).
    """
    from .engine import LlamaCppEngine  # the engine imports this module

    out: dict[str, dict[str, Any]] = {}
    for label, path in models.items():
        try:
            engine = LlamaCppEngine(path, n_ctx=256, n_batch=64, n_threads=n_threads, exact="warn",
                                    validate=False)  # the caller validated (this interpreter may lack `gguf`)
        except Exception as err:  # one unloadable model must not hide the others' verdicts
            out[label] = {"error": str(err)}
            continue
        try:
            out[label] = engine.exactness.as_dict()  # type: ignore[union-attr]
        finally:
            engine.close()
    return out
