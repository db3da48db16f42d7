"""`specdec calibrate MODEL`: measure what a pass over n tokens costs, print the curve, cache it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from specdec_gguf.factory import open_engine
from specdec_gguf.profile import CALIBRATION_SIZES, measure, save, with_timed_context
from specdec_gguf.settings import EngineSettings

from .common import handle_errors


@handle_errors
def calibrate(
    model: Annotated[Path, typer.Argument(help="GGUF model to measure.")],
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (the profile is per thread count).")] = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size")] = 4096,
    n_gpu_layers: Annotated[int, typer.Option("-ngl", "--n-gpu-layers", "--gpu-layers")] = 0,
    flash_attn: Annotated[str, typer.Option("-fa", "--flash-attn", help="Flash attention: auto (on a CPU: timed on and off once, off where clearly faster), on, off; the curve is this setting's.")] = "auto",
    sizes: Annotated[str, typer.Option("--sizes", help="Pass sizes to time, comma-separated.")] = ",".join(map(str, CALIBRATION_SIZES)),
    repeats: Annotated[int, typer.Option("--repeats", help="Times per size (the fastest counts).")] = 2,
    save_profile: Annotated[bool, typer.Option("--save/--no-save", help="Store the profile in the user cache (runs then skip measuring).")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Time one target pass per batch size; adaptive speculation reads this to price each draft token."""
    from specdec_gguf import ConfigError

    try:
        size_list = sorted({int(s) for s in sizes.split(",") if s.strip()})
    except ValueError:
        raise ConfigError(f"--sizes {sizes!r} must be comma-separated integers") from None
    if not size_list or size_list[0] < 1 or repeats < 1:
        raise ConfigError(f"--sizes ({sizes}) must be integers >= 1 and --repeats ({repeats}) >= 1")
    engine = open_engine(EngineSettings(model=model, n_ctx=ctx_size, n_threads=threads, n_gpu_layers=n_gpu_layers,
                                        flash_attn=flash_attn), verbose=verbose)
    try:
        profile = measure(engine, size_list, repeats, token=max(engine.bos_token, 0))
        profile.key = engine.profile_key
        attention = engine.attention  # (flash attention timed on a CPU: see docs/configuration.md)
    finally:
        engine.close()
    saved = save_profile and profile.plausible
    if saved:
        save(profile)
    priced = with_timed_context(profile, attention)  # (what runs price passes with past the short context)
    timed_context = ({"long_context": priced.long_context,
                      "long_seconds": {str(n): s for n, s in sorted(priced.long_seconds.items())}}
                     if priced is not profile else None)
    if json_out:
        print(json.dumps({**profile.as_dict(), "ratios": {str(n): r for n, r in profile.ratios().items()},
                          "plausible": profile.plausible, "saved": saved,
                          "attention": attention.as_dict() if attention is not None else None,
                          "priced_long_context": timed_context}))
        return
    table = Table(title=f"{model.name}: one target pass over n tokens", header_style="bold")
    for col in ("n", "seconds", "vs n=1", "per token"):
        table.add_column(col, justify="right")
    for n, r in profile.ratios().items():
        table.add_row(str(n), f"{profile.seconds[n] * 1e3:.2f} ms", f"{r:.2f}x", f"{r / n:.2f}x")
    console = Console(highlight=False)
    console.print(table)
    console.print(f"a one-token pass after a pass of another size (the plain step after a verify pass) costs "
                  f"{profile.switch_seconds * 1e3:.2f} ms more: llama.cpp rebuilds its graph when the size changes")
    if priced.long_seconds:
        long = priced.long_seconds
        largest = max(long)
        source = " (the flash attention timing's passes below)" if timed_context is not None else ""
        console.print(f"after {priced.long_context} tokens of context{source}: n=1 {long[1] * 1e3:.2f} ms, n={largest} "
                      f"{long[largest] * 1e3:.2f} ms ({long[largest] / long[1]:.2f}x): runs price passes at their "
                      f"prompt's length")
    else:
        console.print("the long-context passes were not timed (no room in the calibration budget or the context): "
                      "costs are taken as the same at any context")
    if attention is not None:
        console.print(attention.summary())
    note = ""
    if saved:
        note = "; saved, so runs with these settings start knowing the curve"
    elif save_profile:
        note = ("; not saved: a longer pass measured cheaper, or far dearer per token, than a shorter one "
                "(was the machine busy? run it again when it is idle)")
    console.print(f"measured in {profile.calibration_seconds:.2f} s" + note)
