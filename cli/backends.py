"""`specdec backends`: which llama.cpp build each interpreter has, its devices, and whether it is exact."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specdec_gguf import EngineError
from specdec_gguf.settings import interpreter_path
from specdec_gguf.exactness import DOCS, INVARIANT_BUILD
from specdec_gguf.modelfile import validate_gguf

from .common import handle_errors

_PROBE = ("import json, sys; from specdec_gguf.engines.llama_cpp import backend_report; "
          "from specdec_gguf.engines.llama_cpp.exactness import check_models; "
          "r = backend_report(); r['exactness'] = check_models(json.loads(sys.argv[1])); print(json.dumps(r))")
TINY_TYPES = ("f32", "f16", "q8_0", "q4_0")  # what gguf can write; K-quants: name a model with --model


def report_for(python: str | None, models: dict[str, str]) -> dict:
    """The backend report of ``python`` (None: this interpreter) with exact mode's verdict per model,
    or EngineError saying what is missing."""
    if python is None:
        from specdec_gguf.engines.llama_cpp import backend_report
        from specdec_gguf.engines.llama_cpp.exactness import check_models

        return {**backend_report(), "exactness": check_models(models)}
    import specdec_gguf

    root = str(Path(specdec_gguf.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([python, "-c", _PROBE, json.dumps(models)], capture_output=True, text=True,
                              timeout=300, env=env)
    except OSError as err:
        raise EngineError(f"cannot run interpreter {python!r}: {err.strerror or err}") from None
    except subprocess.TimeoutExpired:
        raise EngineError(f"interpreter {python!r} did not answer within 300 s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if "llama_cpp" in last:
            last = f"llama-cpp-python is not importable there ({last})"
        raise EngineError(f"interpreter {python!r}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def exactness_cell(verdict: dict) -> str:
    """One table cell: yes, or no with the largest difference and the first reason."""
    if "error" in verdict:
        return f"error: {verdict['error']}"
    if verdict["invariant"]:
        return "yes (bit-identical one-token and batched logits)"
    diff = verdict["comparison"]["max_abs_diff"]
    measured = f"logits differ by up to {diff:.3g}" if verdict["comparison"]["differing_rows"] else "logits identical"
    where = f"; first {verdict['differing_op']}" if verdict.get("differing_op") else ""
    return f"no: {measured}{where}"


def _weight_layout(report: dict) -> str:
    """Whether llama.cpp may repack weights in this build, and why not (backends.extra_buffers_allowed)."""
    if report["extra_buffers"]:
        return "repacked where llama.cpp can"
    if report.get("amx_kernels"):
        return ("plain: this build has AMX kernels, which crash on some machines "
                "(SPECDEC_LLAMA_AMX=1 to use them; docs/troubleshooting.md)")
    return "plain"


@handle_errors
def backends(
    python: Annotated[Optional[list[str]], typer.Option("--python", help="Also report this interpreter (repeatable).")] = None,
    model: Annotated[Optional[list[Path]], typer.Option("-m", "--model", help="Also self-test exact mode on this model (repeatable).")] = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Versions, CPU features, GPU/RPC support, devices, and exact mode's verdict, per interpreter."""
    from specdec_gguf.tiny import write_tiny_model

    with tempfile.TemporaryDirectory(prefix="specdec-backends-") as tmp:
        models = {f"tiny {t}": str(write_tiny_model(Path(tmp) / f"tiny-{t}.gguf", dtype=t)) for t in TINY_TYPES}
        for m in model or []:
            validate_gguf(m)  # here: the other interpreters may lack the `gguf` package
            models[m.name] = str(m.resolve())
        reports = [report_for(None, models)] + [report_for(str(interpreter_path(p)), models) for p in python or []]
    if json_out:
        print(json.dumps(reports))
        return
    console = Console(highlight=False)
    variant_build = False
    for r in reports:
        table = Table(title=r["python"], show_header=False, title_justify="left")
        table.add_row("llama-cpp-python", r["llama_cpp_python"])
        table.add_row("GPU offload", "yes" if r["gpu_offload"] else "no")
        table.add_row("RPC backend", "yes" if r["rpc"] else "no (build with -DGGML_RPC=on)")
        table.add_row("CPU features", r["system_info"])
        if "extra_buffers" in r:  # (an interpreter with an older specdec-gguf doesn't say)
            table.add_row("weight layout", _weight_layout(r))
        for d in r["devices"]:
            mem = f", {d['memory_total'] / 2**30:.1f} GiB ({d['memory_free'] / 2**30:.1f} free)" if d["memory_total"] else ""
            table.add_row(f"device {d['name']}", f"{d['description']}{mem}")
        for label, verdict in r["exactness"].items():
            table.add_row(f"exact: {label}", escape(exactness_cell(verdict)))
            variant_build |= not verdict.get("invariant", True) and verdict["settings"]["llamafile_in_build"]
        console.print(table)
    if variant_build:
        console.print(f"exact mode needs a build without llamafile's sgemm (passes over >= 2 tokens): {INVARIANT_BUILD} "
                      f"(then --target-python can run the target there; see {DOCS})", markup=False)
