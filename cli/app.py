"""The `specdec` typer application."""

from __future__ import annotations

import typer

from .batch import batch
from .inspect_cmd import inspect
from .run import run
from .tiny_cmd import tiny

app = typer.Typer(
    name="specdec", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Speculative decoding for GGUF models on llama.cpp: exact output, faster generation.",
)
app.command()(run)
app.command()(batch)
app.command()(inspect)
app.command()(tiny)


def _register_optional() -> None:
    """Commands defined in their own modules (kept separate so each stays small)."""
    from .bench import bench
    from .demo import demo

    app.command()(bench)
    app.command()(demo)


def main() -> None:
    _register_optional()
    app()


if __name__ == "__main__":
    main()
