"""`specdec inspect`: what a GGUF file holds, and whether a draft fits a target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specdec_gguf import VocabMismatchError
from specdec_gguf.modelfile import summarize

from .common import handle_errors


def _vocab_verdict(model: Path, draft: Path, verbose: bool) -> str | None:
    """None when compatible, else the first mismatch."""
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.vocab import check_compatible

    with LlamaCppEngine(model, n_ctx=64, n_batch=8, verbose=verbose) as t, \
            LlamaCppEngine(draft, n_ctx=64, n_batch=8, verbose=verbose) as d:
        try:
            check_compatible(t, d)
        except VocabMismatchError as err:
            return str(err)
    return None


@handle_errors
def inspect(
    model: Annotated[Path, typer.Argument(help="GGUF model to describe.")],
    draft: Annotated[Optional[Path], typer.Option("--draft", "-md", help="Check this draft model against MODEL.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Architecture, size, quantization, context, vocabulary, rollback support; with --draft, compatibility."""
    summaries = [summarize(model)] + ([summarize(draft)] if draft else [])
    mismatch = _vocab_verdict(model, draft, verbose) if draft else None
    if json_out:
        out = {"model": summaries[0].as_dict()}
        if draft:
            out["draft"] = summaries[1].as_dict()
            out["compatible"] = mismatch is None
            out["mismatch"] = mismatch
        print(json.dumps(out, default=str))
        return
    console = Console()
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    for s, role in zip(summaries, ("model", "draft")):
        table.add_column(f"{role}: {s.path.name}")
    rows = [
        ("architecture", lambda s: s.architecture), ("name", lambda s: s.name),
        ("parameters", lambda s: f"{s.n_params / 1e6:.1f} M"),
        ("file size", lambda s: f"{s.file_bytes / 2**20:.1f} MiB"),
        ("tensor types", lambda s: ", ".join(f"{t}×{n}" for t, n in s.tensor_types.items())),
        ("layers", lambda s: str(s.n_layers)), ("context length", lambda s: str(s.context_length)),
        ("vocab", lambda s: f"{s.vocab_type}, {s.n_vocab} tokens"),
        ("special tokens", lambda s: ", ".join(f"{k}={v}" for k, v in s.special_tokens.items())),
        ("partial rollback", lambda s: "yes (seq_rm)" if s.partial_rollback else "no (checkpoint rollback)"),
    ]
    for label, get in rows:
        table.add_row(label, *(get(s) for s in summaries))
    console.print(table)
    if draft:
        if mismatch is None:
            console.print("[green]compatible:[/] the draft's tokens mean the same text to the target")
        else:
            console.print(f"[red]incompatible:[/] {escape(mismatch)}")
            raise typer.Exit(1)
