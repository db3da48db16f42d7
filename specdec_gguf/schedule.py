"""Draft schedules: how many tokens to draft each round (k = 0 is a plain step)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .engine import ConfigError


@runtime_checkable
class DraftSchedule(Protocol):
    """Chooses k before each round and learns from what the round cost and kept."""

    def start(self) -> None:
        """A new generation begins."""
        ...

    def next_k(self) -> int:
        """Tokens to draft this round (the decoder clips it to the room left)."""
        ...

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """What the last round drafted, accepted and spent."""
        ...


class FixedSchedule(DraftSchedule):
    """Always draft ``k`` tokens."""

    def __init__(self, k: int) -> None:
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"num_draft_tokens={k!r} must be an integer >= 1")
        self.k = k

    def start(self) -> None:
        return None

    def next_k(self) -> int:
        return self.k

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        return None
