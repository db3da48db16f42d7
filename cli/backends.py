"""`specdec backends`: which llama.cpp build each interpreter has, and its devices."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from specdec_gguf import EngineError
from specdec_gguf.settings import interpreter_path

from .common import handle_errors

_PROBE = "import json; from specdec_gguf.engines.llama_cpp import backend_report; print(json.dumps(backend_report()))"


def report_for(python: str | None) -> dict:
    """The backend report of ``python`` (None: this interpreter), or EngineError saying what is missing."""
    if python is None:
        from specdec_gguf.engines.llama_cpp import backend_report

        return backend_report()
    import specdec_gguf

    root = str(Path(specdec_gguf.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env)
    except OSError as err:
        raise EngineError(f"cannot run interpreter {python!r}: {err.strerror or err}") from None
    except subprocess.TimeoutExpired:
        raise EngineError(f"interpreter {python!r} did not answer within 120 s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if "llama_cpp" in last:
            last = f"llama-cpp-python is not importable there ({last})"
        raise EngineError(f"interpreter {python!r}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@handle_errors
def backends(
    python: Annotated[Optional[list[str]], typer.Option("--python", help="Also report this interpreter (repeatable).")] = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Versions, CPU features, GPU/RPC support and devices of this and other interpreters' builds."""
    reports = [report_for(None)] + [report_for(str(interpreter_path(p))) for p in python or []]
    if json_out:
        print(json.dumps(reports))
        return
    console = Console(highlight=False)
    for r in reports:
        table = Table(title=r["python"], show_header=False, title_justify="left")
        table.add_row("llama-cpp-python", r["llama_cpp_python"])
        table.add_row("GPU offload", "yes" if r["gpu_offload"] else "no")
        table.add_row("RPC backend", "yes" if r["rpc"] else "no (build with -DGGML_RPC=on)")
        table.add_row("CPU features", r["system_info"])
        for d in r["devices"]:
            mem = f", {d['memory_total'] / 2**30:.1f} GiB ({d['memory_free'] / 2**30:.1f} free)" if d["memory_total"] else ""
            table.add_row(f"device {d['name']}", f"{d['description']}{mem}")
        console.print(table)
