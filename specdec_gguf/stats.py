"""SpecStats: the counters one generation accumulates, and the figures derived from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SpecStats:
    """Counters of one generation; the derived figures use the glossary's names.

    ``per_position_drafted[i]`` / ``per_position_accepted[i]`` count draft slot i
    (0-based) over all rounds; ``accepted_length_histogram[m]`` counts rounds that
    accepted exactly m drafted tokens (rounds that drafted nothing are not counted).
    ``declined`` counts rounds whose proposal none of was verified: plain steps that paid for a
    draft (an adaptive schedule looking or finding the proposal too unsure, or a proposal shorter
    than the decoder's ``draft_min``).
    """

    prompt_tokens: int = 0
    generated_tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    declined: int = 0
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    accepted_length_histogram: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    # The target's passes in rounds that verified no drafted token (the pass alone, within verify_seconds)
    plain_step_seconds: float = 0.0
    generation_seconds: float = 0.0

    def record_round(self, drafted: int, accepted: int, generated: int, declined: bool = False) -> None:
        """Count one round: ``drafted`` proposed, ``accepted`` kept, ``generated`` emitted; ``declined``: the
        drafter proposed tokens and none was verified (then ``drafted`` is 0)."""
        self.target_passes += 1
        self.declined += declined
        self.drafted += drafted
        self.accepted += accepted
        self.generated_tokens += generated
        if drafted:
            _grow(self.per_position_drafted, drafted)
            _grow(self.per_position_accepted, drafted)
            _grow(self.accepted_length_histogram, drafted + 1)
            for i in range(drafted):
                self.per_position_drafted[i] += 1
            for i in range(accepted):
                self.per_position_accepted[i] += 1
            self.accepted_length_histogram[accepted] += 1

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted over the run (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def passes_by_verified(self) -> list[int]:
        """Target passes by how many drafted tokens they verified: item j counts the passes that verified j
        (item 0: plain steps, declined proposals' included)."""
        drafted = self.per_position_drafted  # (item i: the rounds that verified more than i drafted tokens)
        counts = [self.target_passes - (drafted[0] if drafted else 0)]
        counts += [n - (drafted[j + 1] if j + 1 < len(drafted) else 0) for j, n in enumerate(drafted)]
        return counts

    @property
    def plain_step(self) -> float | None:
        """Mean seconds of this generation's plain steps (rounds that verified no drafted token); None
        without any."""
        steps = self.target_passes - (self.per_position_drafted[0] if self.per_position_drafted else 0)
        return self.plain_step_seconds / steps if steps and self.plain_step_seconds > 0 else None

    @property
    def tokens_per_target_pass(self) -> float:
        """generated tokens / target passes; plain decoding gives 1.0."""
        return self.generated_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Mean drafted tokens accepted per round that drafted anything."""
        rounds = sum(self.accepted_length_histogram)
        return self.accepted / rounds if rounds else 0.0

    @property
    def generation_throughput(self) -> float:
        """generated tokens / generation seconds, prefill excluded."""
        return self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """Share of rounds that drafted slot i in which slot i was accepted."""
        return [a / d if d else 0.0 for a, d in zip(self.per_position_accepted, self.per_position_drafted)]

    def as_dict(self) -> dict[str, Any]:
        """Every counter and derived figure, keyed by its glossary name."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "target_passes": self.target_passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "declined": self.declined,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_target_pass": self.tokens_per_target_pass,
            "mean_accepted_length": self.mean_accepted_length,
            "per_position_drafted": list(self.per_position_drafted),
            "per_position_accepted": list(self.per_position_accepted),
            "per_position_acceptance": self.per_position_acceptance,
            "accepted_length_histogram": list(self.accepted_length_histogram),
            "passes_by_verified": self.passes_by_verified,
            "prefill_seconds": self.prefill_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "plain_step_seconds": self.plain_step_seconds,
            "plain_step": self.plain_step,
            "generation_seconds": self.generation_seconds,
            "generation_throughput": self.generation_throughput,
        }

    def copy(self) -> SpecStats:
        """An independent snapshot (lists copied), safe to hand to a consumer mid-run."""
        return SpecStats(**{**self.__dict__,
                            "per_position_drafted": list(self.per_position_drafted),
                            "per_position_accepted": list(self.per_position_accepted),
                            "accepted_length_histogram": list(self.accepted_length_histogram)})


def _grow(counts: list[int], size: int) -> None:
    if len(counts) < size:
        counts.extend([0] * (size - len(counts)))
