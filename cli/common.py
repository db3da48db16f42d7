"""What every command shares: one-line errors, consoles, option types."""

from __future__ import annotations

import functools
import sys
import traceback
from typing import Any, Callable, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from specdec_gguf import ConfigError, SpecDecError

F = TypeVar("F", bound=Callable[..., Any])

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one readable error line and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    return typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn library errors into one line and a non-zero exit; tracebacks only with --verbose."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        verbose = bool(kwargs.get("verbose"))
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except SpecDecError as err:
            if verbose:
                traceback.print_exc()
            raise fail(str(err)) from None
        except OSError as err:
            if verbose:
                traceback.print_exc()
            raise fail(f"{err.filename or ''}: {err.strerror or err}".lstrip(": ")) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def exact_flag(exact: bool, exact_warn: bool) -> bool | str | None:
    """``--exact`` / ``--exact-warn`` -> EngineSettings.exact (None: neither given, the config decides)."""
    if exact and exact_warn:
        raise ConfigError("choose one of --exact (fail unless bit-invariant) and --exact-warn (warn only)")
    return True if exact else "warn" if exact_warn else None


def report_exactness(engine: Any, role: str) -> None:
    """Exact mode's verdict for one engine on stderr: one line, a warning when it is not bit-invariant."""
    verdict = engine.exactness
    if verdict is None:
        return
    if verdict.invariant:
        err_console.print(f"exact mode ({role}): {escape(verdict.summary())}", markup=True)
    else:
        err_console.print(f"[bold yellow]warning:[/] exact mode ({role}): {escape(verdict.summary())}; greedy "
                          "output may differ from plain decoding where two logits nearly tie", markup=True)


def exactness_json(*engines: tuple[str, Any]) -> dict[str, Any]:
    """``{"target": verdict or None, "draft": ...}`` for --json outputs."""
    return _engines_json("exactness", engines)


def attention_json(*engines: tuple[str, Any]) -> dict[str, Any]:
    """``{"target": flash attention choice or None, "draft": ...}`` for --json outputs (None: not chosen by
    timing — given, exact mode, or an engine that doesn't say)."""
    return _engines_json("attention", engines)


def _engines_json(name: str, engines: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """Per role, the engine's record ``name`` as a dict (None: no engine, or none recorded)."""
    return {role: record.as_dict() if (record := getattr(e, name, None)) is not None else None
            for role, e in engines}


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
