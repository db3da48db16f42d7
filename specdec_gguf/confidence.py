"""Calibrated acceptance: the chance a drafted token is accepted, learned online per feature bucket.

A drafter labels each token it proposes with a *bucket* — what it knew before verifying
(prompt lookup: how long the matched context is; a draft model: its own probability of
the token) — and gives a prior acceptance per bucket. The estimate is conditional: the
chance of acceptance given every earlier token of the proposal was accepted.

Two layers learn from every verified token (the first ``accepted`` were accepted, the
next one was rejected; tokens after a rejection tell nothing):

1. a pooled calibration of the drafter's priors, ``σ(a + s·logit(prior) + d₁·later + d₂·deep)``,
   fitted to all buckets' outcomes at once, so evidence from a few buckets moves them all (a
   copy task seen in long matches makes shorter matches believable too);
2. Beta counts per bucket around that pooled estimate, so each bucket ends up following
   its own outcomes.

``later`` marks a token after the first of its proposal, ``deep`` one from the fifth on.
Acceptance is bursty (a draft that got the first tokens right is in an easy stretch and
likely gets the next right too), so a later token in a bucket is likelier accepted than a
first one, and a deep one likelier still: each bucket keeps its first, later and deep
tokens apart, and the pooled shifts ``d₁, d₂`` let every bucket learn that from all of them
at once.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .errors import ConfigError

_REFIT_EVERY = 4  # updates between refits of the pooled calibration (a refit costs ~50 µs)
_DEPTH = (0, 1, 1, 1, 2)  # slot group of a token at position 0, 1, ... in its proposal (4 and on: deep)
_IDENTITY = (0.0, 1.0, 0.0, 0.0)  # the calibration that leaves the drafter's priors as they are
_MIN_SLOPE = 0.1  # s: the priors' order must stay
# Log-likelihood ratio by which this run's first outcomes must favour a remembered calibration over
# the priors as given for it to take effect before the first regular refit.
_EARLY_EVIDENCE = math.log(8.0)


class AcceptanceModel:
    """Calibrated acceptance per bucket; ``confidence(bucket)`` is its posterior mean.

    ``priors[i]`` is bucket i's prior mean; ``strength`` is how many observations the
    (pooled) prior is worth in a bucket; ``recency`` caps a bucket's count so estimates keep
    following a drafter whose accuracy drifts (a copy ends, a topic changes).
    ``calibration``: the pooled calibration ``(a, s, d₁, d₂)`` to pull the fit towards (what earlier
    runs of this drafter and target learned; None: the priors as given). The model still starts
    from the priors as given and moves there with its first refit, once this run's own outcomes
    are in: a calibration learned on other prompts is confirmed before it is bet on (started
    there, the simulation lost up to 9% to plain decoding on a prompt unlike the earlier ones).
    That refit comes after ``_REFIT_EVERY`` updates, or as soon as this run's outcomes favour the
    remembered calibration over the priors as given by a likelihood ratio of 8 (two right first
    tokens where the priors said 0.15 and the calibration 0.8): a draft that undersells itself
    was otherwise looked at one token a round for four rounds, 8% of a 64-token answer.
    """

    def __init__(self, priors: Sequence[float], strength: float = 3.0, recency: float = 64.0,
                 calibration: Sequence[float] | None = None) -> None:
        if not len(priors):
            raise ConfigError("an acceptance model needs at least one bucket prior")
        if any(not 0.0 < p < 1.0 for p in priors):
            raise ConfigError(f"bucket priors must lie in (0, 1); got {list(priors)}")
        if strength <= 0 or recency < 1:
            raise ConfigError(f"strength={strength} must be > 0 and recency={recency} >= 1")
        centre = _IDENTITY if calibration is None else tuple(float(v) for v in calibration)
        if len(centre) != 4 or not all(np.isfinite(centre)) or centre[1] < _MIN_SLOPE:
            raise ConfigError(f"calibration={calibration!r} must be four finite numbers (a, s, d1, d2) with s >= "
                              f"{_MIN_SLOPE}")
        self.strength, self.recency = strength, recency
        self._n = len(priors)
        # Slots: bucket b's first tokens at b, its later ones at n + b, its deep ones at 2n + b.
        prior = np.tile(np.asarray(priors, dtype=np.float64), 3)
        self._later = np.repeat([0.0, 1.0, 1.0], self._n)
        self._deep = np.repeat([0.0, 0.0, 1.0], self._n)
        self._logit = np.log(prior / (1 - prior))
        self._hits = np.zeros(len(prior))
        self._total = np.zeros(len(prior))
        self._unverified_hits = np.zeros(len(prior))  # outcomes seen without verifying (calibration only)
        self._unverified_total = np.zeros(len(prior))
        self._centre = np.array(centre)
        self.observations = [0] * self._n  # verified tokens per bucket
        self.outcomes = 0  # every outcome counted, verified or not: what taught the calibration
        self._since_fit = 0
        self._apply(_IDENTITY)
        # Until the first refit: how much better the remembered calibration predicted the outcomes so
        # far than the priors as given (log-likelihood ratio; None: nothing remembered).
        self._evidence: float | None = None if calibration is None else 0.0
        self._centre_pooled: list[float] = []  # what the remembered calibration says of each slot
        if calibration is not None:
            self._centre_pooled = np.clip(self._slot_means(self._centre), 1e-6, 1.0 - 1e-6).tolist()

    @property
    def centre(self) -> tuple[float, float, float, float]:
        """The calibration the fit is pulled towards (the identity when none was given)."""
        return tuple(float(v) for v in self._centre)  # type: ignore[return-value]

    def fitted(self) -> tuple[float, float, float, float]:
        """The pooled calibration with every outcome so far in it (refitted if some came since the last fit)."""
        if self._since_fit:
            self._refit()
        return self.calibration

    def __len__(self) -> int:
        return self._n

    def confidence(self, bucket: int, position: int = 0) -> float:
        """Posterior mean acceptance of a token in ``bucket`` at ``position`` in its proposal (0: the
        first), given the tokens before it were accepted."""
        return self._mean[bucket + self._n * _DEPTH[min(position, 4)]]

    def update(self, buckets: Sequence[int], accepted: int) -> None:
        """A proposal's verified tokens with these buckets: the first ``accepted`` were accepted, the next
        rejected."""
        hits, total, n = self._hits, self._total, self._n
        for i, b in enumerate(buckets[: accepted + 1]):
            self.observations[b] += 1
            b += n * _DEPTH[min(i, 4)]
            self._count(hits, total, b, i < accepted)
            self._mean[b] = (hits[b] + self.strength * self._pooled[b]) / (total[b] + self.strength)
        self._counted()

    def update_calibration(self, bucket: int, accepted: bool | float) -> None:
        """An outcome seen without verifying (a declined greedy proposal's first token against the
        token the plain step produced, or, sampled, the chance it would have been accepted): it moves
        the pooled calibration, not the bucket's own count."""
        self._count(self._unverified_hits, self._unverified_total, bucket, accepted)
        self._counted()

    def _count(self, hits: np.ndarray, total: np.ndarray, bucket: int, hit: bool | float) -> None:
        if total[bucket] >= self.recency:  # forget a little: keep following recent outcomes
            scale = (self.recency - 1.0) / total[bucket]
            hits[bucket] *= scale
            total[bucket] *= scale
        hit = float(hit)  # (a chance of acceptance counts as that share of a hit)
        hits[bucket] += hit
        total[bucket] += 1.0
        self.outcomes += 1
        if self._evidence is not None:
            remembered, given = self._centre_pooled[bucket], self._pooled[bucket]
            self._evidence += hit * math.log(remembered / given) + (1.0 - hit) * math.log(
                (1.0 - remembered) / (1.0 - given))

    def _counted(self) -> None:
        self._since_fit += 1
        if self._since_fit >= _REFIT_EVERY or self._evidence is not None and self._evidence >= _EARLY_EVIDENCE:
            self._refit()

    def _refit(self) -> None:
        """Fit (a, s, d) by a few Newton steps on all buckets' counts, with a Gaussian prior at (0, 1, 0)."""
        self._since_fit = 0
        self._evidence = None  # (the fit weighs this run's outcomes from now on)
        hits, total = self._hits + self._unverified_hits, self._total + self._unverified_total
        seen = total > 0
        y, n = hits[seen], total[seen]
        features = np.stack([np.ones(len(y)), self._logit[seen], self._later[seen], self._deep[seen]])  # [4, seen]
        theta = np.array(self.calibration)
        precision = np.diag([1.0, 4.0, 1.0, 1.0])  # 1 / how far the data may move a, s, d₁ and d₂
        for _ in range(4):
            p = 1.0 / (1.0 + np.exp(-(theta @ features)))
            grad = features @ (y - n * p) - precision @ (theta - self._centre)
            hess = (features * (n * p * (1 - p))) @ features.T + precision
            theta = theta + np.linalg.solve(hess, grad)
        theta[1] = max(theta[1], _MIN_SLOPE)  # the prior's order must stay: a surer bucket never becomes a less sure one
        self._apply(tuple(float(v) for v in theta))

    def _apply(self, calibration: Sequence[float]) -> None:
        """Make ``calibration`` the pooled estimate and recompute every slot's posterior mean."""
        a, s, d1, d2 = calibration
        self.calibration = (float(a), float(s), float(d1), float(d2))
        self._pooled = self._slot_means(calibration)
        self._mean = ((self._hits + self.strength * self._pooled) / (self._total + self.strength)).tolist()

    def _slot_means(self, calibration: Sequence[float]) -> np.ndarray:
        """Every slot's acceptance as ``calibration`` says (the pooled estimate, before its counts)."""
        a, s, d1, d2 = calibration
        return 1.0 / (1.0 + np.exp(-(a + s * self._logit + d1 * self._later + d2 * self._deep)))
