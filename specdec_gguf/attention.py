"""What ``flash_attn="auto"`` chose for an engine and why (the timing itself: ``engines/llama_cpp/attention.py``).

Kept apart from the timing so a child-process engine can report its child's choice without importing llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AttentionChoice:
    """Whether flash attention is on (None: as llama.cpp chooses, untimed, for ``reason``), and the timings that
    chose it: per setting ("on" / "off"), seconds of a pass by its size, after ``context`` tokens."""

    flash_attn: bool | None
    seconds: dict[str, dict[int, float]] = field(default_factory=dict)
    context: int = 0
    from_cache: bool = False
    probe_seconds: float = 0.0  # how long timing both took (0 when read from the cache)
    reason: str = ""  # why nothing was timed (flash_attn None)

    def summary(self) -> str:
        """One line for people: the choice and what it rests on."""
        if self.flash_attn is None:
            return f"flash attention as llama.cpp chooses (not timed: {self.reason})"
        timed = ", ".join(f"{name} {sum(by_n.values()) * 1e3:.1f} ms" for name, by_n in sorted(self.seconds.items()))
        sizes = " + ".join(f"{n}-token" for n in sorted(next(iter(self.seconds.values()), {})))
        return (f"flash attention {'on' if self.flash_attn else 'off'} (a {sizes} pass after {self.context} "
                f"tokens: {timed}{'; cached' if self.from_cache else ''})")

    def as_dict(self) -> dict[str, Any]:
        return {"flash_attn": self.flash_attn, "context": self.context, "from_cache": self.from_cache,
                "probe_seconds": self.probe_seconds, "reason": self.reason,
                "seconds": {name: {str(n): s for n, s in by_n.items()} for name, by_n in self.seconds.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, from_cache: bool | None = None) -> AttentionChoice:
        """The choice ``as_dict`` wrote (``from_cache``: override what it says). Raises KeyError, TypeError or
        ValueError on anything else."""
        flash = data["flash_attn"]
        return cls(flash_attn=None if flash is None else bool(flash), context=int(data["context"]),
                   from_cache=bool(data["from_cache"]) if from_cache is None else from_cache,
                   probe_seconds=float(data.get("probe_seconds", 0.0)), reason=str(data.get("reason", "")),
                   seconds={str(name): {int(n): float(s) for n, s in by_n.items()}
                            for name, by_n in data["seconds"].items()})
