"""`specdec tiny DIR`: write the tiny random model family, for trying the tool without downloads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specdec_gguf.tiny import CHATML_TEMPLATE, CHATML_TOKENS, write_tiny_family

from .common import handle_errors


@handle_errors
def tiny(
    directory: Annotated[Path, typer.Argument(help="Folder to write tiny-target.gguf and tiny-draft.gguf into.")],
    seed: Annotated[int, typer.Option("--seed", help="Weights seed.")] = 0,
    gain: Annotated[float, typer.Option("--gain", help="How far the target's extra layers move it from the draft (0: identical greedy tokens).")] = 0.25,
    dtype: Annotated[str, typer.Option("--dtype", help="f32, f16, q8_0 or q4_0.")] = "f32",
    chat: Annotated[bool, typer.Option("--chat", help="Give the models a ChatML chat template (for --chat and serve).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Write a tiny random target and a draft that agrees with it on most tokens."""
    family = write_tiny_family(directory, seed=seed, gain=gain, dtype=dtype,
                               chat_template=CHATML_TEMPLATE if chat else None,
                               special_tokens=CHATML_TOKENS if chat else ())
    console = Console(highlight=False, markup=False, soft_wrap=True)
    console.print(f"wrote {family.target} and {family.draft}")
    console.print("try next:")
    console.print(f"  specdec run -m {family.target} -md {family.draft} -p 'the model is' -n 64")
    console.print("  specdec batch configs/tiny.toml     # in a checkout, after `specdec tiny tiny` there")
