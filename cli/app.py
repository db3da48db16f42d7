"""The `specdec` typer application."""

from __future__ import annotations

import typer

from .backends import backends
from .batch import batch
from .bench import bench
from .calibrate import calibrate
from .demo import demo
from .inspect_cmd import inspect
from .run import run
from .serve import serve
from .tiny_cmd import tiny

app = typer.Typer(
    name="specdec", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Speculative decoding for GGUF models on llama.cpp: exact output, faster generation.",
)
for command in (run, serve, batch, bench, calibrate, inspect, tiny, demo, backends):
    app.command()(command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
