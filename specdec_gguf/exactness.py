"""Batch invariance: does a pass over several tokens give a position the same logits as a one-token pass?

The decoder is exact with respect to the logits it is given: greedy speculative output
is the target's greedy output *as computed by the verify passes*. Plain decoding
computes each token in a one-token pass, speculative decoding in a pass over
``[anchor] + proposal``. Only when those two give bit-identical logits is speculative
greedy output token-for-token plain greedy output. This module measures that on any
engine (one-token rows vs the same window in passes of several sizes) and holds the
verdict; ``engines/llama_cpp/exactness.py`` adds what exact mode sets in llama.cpp.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from .engine import SpeculativeEngine
from .errors import ExactnessError

DOCS = "docs/exactness.md"
#: The pip line that installs a CPU build of llama-cpp-python without the batch-variant llamafile GEMM.
INVARIANT_BUILD = ('CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" pip install --force-reinstall --no-cache-dir '
                   '--no-binary llama-cpp-python llama-cpp-python')
#: Batch sizes the self-test compares one-token rows against (the window is cut into passes of each size).
CHECK_BATCH_SIZES = (2, 8, 17)  # llamafile's sgemm starts at 2 tokens, the tiled K-quant matmul at 8


@dataclass(frozen=True)
class BatchComparison:
    """One-token vs batched logits over a window of positions (what the self-test measured)."""

    rows: int  # positions compared
    batch_sizes: tuple[int, ...]  # the pass sizes the window was cut into, one comparison each
    max_abs_diff: float  # the largest |one-token - batched| logit over every row and batch size
    differing_rows: int  # rows (over all batch sizes) that are not bit-identical
    first_differing: int | None  # earliest window position (0-based) that differed, or None

    @property
    def identical(self) -> bool:
        return self.differing_rows == 0


@dataclass(frozen=True)
class Exactness:
    """The exact-mode verdict for one engine: is this build + model + settings batch-invariant?

    ``invariant`` holds when the engine's one-token and batched logits were bit-identical and,
    where the engine can trace its passes (llama.cpp on the CPU), so was every intermediate
    tensor compared (``tensors_compared``); ``differing_op`` names the first that was not,
    ``reasons`` say why and what fixes it.
    """

    invariant: bool
    comparison: BatchComparison
    differing_op: str | None = None  # e.g. "MUL_MAT(f16, f32) at kq-0"
    tensors_compared: int = 0  # intermediate tensors compared bitwise (0: not traced)
    reasons: tuple[str, ...] = ()  # why the verdict is "not invariant" (empty when invariant)
    settings: dict[str, Any] = field(default_factory=dict)  # what exact mode set, for reports

    def summary(self) -> str:
        """One line for people: the verdict, what was compared, the largest difference."""
        c = self.comparison
        sizes = "/".join(str(s) for s in c.batch_sizes)
        traced = f" and {self.tensors_compared} intermediate tensors" if self.tensors_compared else ""
        if self.invariant:
            return (f"bit-invariant: {c.rows} positions, one-token vs batched passes of {sizes} tokens, "
                    f"identical logits{traced}")
        measured = (f"logits differ by up to {c.max_abs_diff:.3g} ({c.differing_rows} of "
                    f"{c.rows * len(c.batch_sizes)} rows)" if not c.identical else "logits identical")
        return f"NOT bit-invariant: {measured}; " + "; ".join(self.reasons)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for --json, results files and ProcessEngine's pipe)."""
        out = asdict(self)
        out["summary"] = self.summary()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Exactness:
        comparison = dict(data["comparison"])
        comparison["batch_sizes"] = tuple(comparison["batch_sizes"])
        return cls(invariant=bool(data["invariant"]), comparison=BatchComparison(**comparison),
                   differing_op=data.get("differing_op"), tensors_compared=int(data.get("tensors_compared", 0)),
                   reasons=tuple(data.get("reasons", ())), settings=dict(data.get("settings", {})))


def probe_tokens(n_vocab: int, count: int, *, first: int | None = None, seed: int = 0) -> list[int]:
    """``count`` deterministic pseudo-random token ids in ``[0, n_vocab)`` (``first`` leads, e.g. BOS)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, n_vocab, size=count).tolist()
    if first is not None and count:
        ids[0] = first
    return ids


def compare_batched(engine: SpeculativeEngine, prefix: Sequence[int], window: Sequence[int],
                    batch_sizes: Sequence[int] = CHECK_BATCH_SIZES) -> BatchComparison:
    """Logits of ``window`` after ``prefix``: one token per pass vs passes of each size in ``batch_sizes``.

    Bitwise comparison (NaN == NaN, -0.0 != 0.0). Starts from an empty cache and leaves one.
    """
    engine.reset(0)
    engine.advance(list(prefix))
    base = len(prefix)
    single = np.empty((len(window), engine.n_vocab), dtype=np.float32)  # [w, V]
    for i, token in enumerate(window):
        single[i] = engine.forward_logits([token])[0]
    max_diff, differing, first = 0.0, 0, None
    for size in batch_sizes:
        engine.reset(base)
        for start in range(0, len(window), size):
            rows = engine.forward_logits(list(window[start:start + size]))  # [m, V] view
            ref = single[start:start + rows.shape[0]]
            same = np.all(rows.view(np.uint32) == ref.view(np.uint32), axis=1)  # [m]
            if not same.all():
                differing += int((~same).sum())
                at = start + int(np.argmin(same))
                first = at if first is None else min(first, at)
                with np.errstate(invalid="ignore"):
                    max_diff = max(max_diff, float(np.nanmax(np.abs(rows - ref))))
    engine.reset(0)
    return BatchComparison(rows=len(window), batch_sizes=tuple(batch_sizes), max_abs_diff=max_diff,
                           differing_rows=differing, first_differing=first)


def not_exact_error(where: str, verdict: Exactness) -> ExactnessError:
    """The error exact=True raises when the self-test's verdict is "not invariant"."""
    return ExactnessError(f"{where}: exact mode: {verdict.summary()} (see {DOCS}; to run anyway: "
                          "--exact-warn or exact='warn')")
