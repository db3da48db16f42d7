"""`specdec batch CONFIG`: named runs over a prompt set, JSONL results, resumable, with a summary table."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specdec_gguf.batch import BatchRunner, StopFlag
from specdec_gguf.config import load_batch_config

from .common import handle_errors, stdout_is_tty


def summary_table(records: list[dict[str, Any]], run_names: list[str]) -> Table:
    """Per run: acceptance rate, tokens per pass, median tok/s, speed-up over the plain run if any."""
    table = Table(title="batch summary", header_style="bold")
    for col in ("run", "prompts", "acceptance rate", "tokens / target pass", "median tok/s", "speed-up"):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
    by_run = {name: [r for r in records if r["run"] == name] for name in run_names}
    medians = {name: statistics.median([r["stats"]["generation_throughput"] for r in rs]) if rs else 0.0
               for name, rs in by_run.items()}
    plain = next((name for name, rs in by_run.items()
                  if rs and all(r["stats"]["drafted"] == 0 for r in rs)), None)
    for name, rs in by_run.items():
        if not rs:
            table.add_row(name, "0", "-", "-", "-", "-")
            continue
        drafted = sum(r["stats"]["drafted"] for r in rs)
        accepted = sum(r["stats"]["accepted"] for r in rs)
        passes = sum(r["stats"]["target_passes"] for r in rs)
        generated = sum(r["stats"]["generated_tokens"] for r in rs)
        speedup = f"{medians[name] / medians[plain]:.2f}x" if plain and medians[plain] > 0 else "-"
        table.add_row(name, str(len(rs)), f"{accepted / drafted:.1%}" if drafted else "-",
                      f"{generated / passes:.2f}" if passes else "-", f"{medians[name]:.1f}", speedup)
    return table


@handle_errors
def batch(
    config: Annotated[Path, typer.Argument(help="Batch config (TOML).")],
    resume: Annotated[bool, typer.Option("--resume", help="Skip (run, prompt) pairs already in the results file.")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Results JSONL (overrides the config's output).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Run every configured run over every prompt; append one JSONL line per result as it finishes."""
    cfg = load_batch_config(config)
    if output is not None:
        from dataclasses import replace

        cfg = replace(cfg, output=output)
    console = Console(stderr=True)
    if not resume and cfg.output.is_file() and cfg.output.stat().st_size > 0:
        from specdec_gguf import ConfigError

        raise ConfigError(f"{cfg.output}: results file exists; pass --resume to continue it, "
                          "or remove it / choose -o to start over")
    runner = BatchRunner(cfg, verbose=verbose)
    records: list[dict[str, Any]] = []
    try:
        items = runner.pending(resume)
        runner.save_config()
        skipped = len(cfg.runs) * len(cfg.prompts) - len(items)
        if skipped:
            console.print(f"resuming: {skipped} results already in {cfg.output}", markup=False)
        with StopFlag() as stop, Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                          TimeElapsedColumn(), console=console, transient=True) as progress:
            task = progress.add_task("batch", total=len(items))
            for item, record in runner.run(items, stop):
                records.append(record)
                progress.update(task, advance=1, description=f"{item.run.name} · {item.prompt.id}")
            interrupted = stop.requested
    finally:
        runner.close()
    all_records = _read_all(cfg.output)
    Console(width=None if stdout_is_tty() else 120).print(summary_table(all_records, [r.name for r in cfg.runs]))
    Console(highlight=False).print(f"results: {cfg.output} ({len(records)} new lines)", markup=False)
    if interrupted:
        console.print("stopped early: rerun with --resume to finish")
        raise typer.Exit(130)


def _read_all(path: Path) -> list[dict[str, Any]]:
    import json

    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
