"""`specdec batch CONFIG`: named runs over a prompt set, JSONL results, resumable, with a summary table."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specdec_gguf.batch import BatchItem, BatchRunner, RunSummary, StopFlag, read_results, summarize_results
from specdec_gguf.config import load_batch_config

from .common import exact_flag, handle_errors, report_exactness, stdout_is_tty


def summary_table(summaries: list[RunSummary]) -> Table:
    """Per run: acceptance rate, tokens per pass, median tok/s, speed-up over the plain run."""
    table = Table(title="batch summary", header_style="bold")
    for col in ("run", "prompts", "acceptance rate", "tokens / target pass", "median tok/s", "speed-up"):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
    for s in summaries:
        table.add_row(s.name, str(s.prompts),
                      f"{s.acceptance_rate:.1%}" if s.acceptance_rate is not None else "-",
                      f"{s.tokens_per_target_pass:.2f}" if s.tokens_per_target_pass is not None else "-",
                      f"{s.median_throughput:.1f}" if s.median_throughput is not None else "-",
                      f"{s.speedup:.2f}x" if s.speedup is not None else "-")
    return table


@handle_errors
def batch(
    config: Annotated[Path, typer.Argument(help="Batch config (TOML).")],
    resume: Annotated[bool, typer.Option("--resume", help="Skip (run, prompt) pairs already in the results file.")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Results JSONL (overrides the config's output).")] = None,
    exact: Annotated[bool, typer.Option("--exact", help="Target in exact mode (overrides the config's \\[target] exact): fail unless bit-invariant.")] = False,
    exact_warn: Annotated[bool, typer.Option("--exact-warn", help="Target in exact mode, only warn when it is not bit-invariant.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Run every configured run over every prompt; append one JSONL line per result as it finishes."""
    cfg = load_batch_config(config)
    if output is not None:
        cfg = replace(cfg, output=output)
    exact_mode = exact_flag(exact, exact_warn)
    if exact_mode is not None:
        cfg = replace(cfg, target=replace(cfg.target, exact=exact_mode))
    console = Console(stderr=True)
    if not resume and cfg.output.is_file() and cfg.output.stat().st_size > 0:
        from specdec_gguf import ConfigError

        raise ConfigError(f"{cfg.output}: results file exists; pass --resume to continue it, "
                          "or remove it / choose -o to start over")
    runner = BatchRunner(cfg, verbose=verbose)
    report_exactness(runner.target, "target")
    records: list[dict[str, Any]] = []
    def first_signal() -> None:
        # Runs inside the signal handler: one plain write (rich's print is not reentrant).
        item = runner.in_progress
        message = (f"stopping after {item.run.name} · {item.prompt.id}; Ctrl-C again drops it" if item
                   else "stopping before the next prompt")
        os.write(2, (message + "\n").encode())

    try:
        # Signals are handled from here on, so whatever this prints comes after they are.
        with StopFlag(on_first=first_signal) as stop:
            items = runner.pending(resume)
            runner.save_config()
            skipped = len(cfg.runs) * len(cfg.prompts) - len(items)
            if skipped:
                console.print(f"resuming: {skipped} results already in {cfg.output}", markup=False)
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console, transient=True, disable=not console.is_terminal) as progress:
                task = progress.add_task("batch", total=len(items))

                def started(item: BatchItem) -> None:
                    name = f"{item.run.name} · {item.prompt.id}"
                    progress.update(task, description=escape(name))
                    if not console.is_terminal:  # no progress bar to show it: one line per prompt
                        console.print(f"[{len(records) + 1}/{len(items)}] {name}", markup=False, highlight=False)

                for item, record in runner.run(items, stop, on_start=started):
                    records.append(record)
                    progress.update(task, advance=1)
            interrupted = stop.requested
    finally:
        runner.close()
    summaries = summarize_results(read_results(cfg.output), [r.name for r in cfg.runs])
    Console(width=None if stdout_is_tty() else 120).print(summary_table(summaries))
    Console(highlight=False).print(f"results: {cfg.output} ({len(records)} new lines)", markup=False)
    if interrupted:
        console.print("stopped early: rerun with --resume to finish")
        raise typer.Exit(130)

