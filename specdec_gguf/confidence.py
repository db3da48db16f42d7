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

from .errors import ConfigError

_REFIT_EVERY = 4  # updates between refits of the pooled calibration (a refit costs ~50 µs)
_DEPTH = (0, 1, 1, 1, 2)  # slot group of a token at position 0, 1, ... in its proposal (4 and on: deep)
_IDENTITY = (0.0, 1.0, 0.0, 0.0)  # the calibration that leaves the drafter's priors as they are
_MIN_SLOPE = 0.1  # s: the priors' order must stay


def slot_group(position: int) -> int:
    """The slot group of a token at ``position`` in its proposal: 0 first, 1 later, 2 deep (see the module docs)."""
    return _DEPTH[min(position, 4)]


class AcceptanceModel:
    """Calibrated acceptance per bucket; ``confidence(bucket)`` is its posterior mean.

    ``priors[i]`` is bucket i's prior mean; ``strength`` is how many observations the
    (pooled) prior is worth in a bucket; ``recency`` caps a bucket's count so estimates keep
    following a drafter whose accuracy drifts (a copy ends, a topic changes).
    ``calibration``: the pooled calibration ``(a, s, d₁, d₂)`` to pull the fit towards (what earlier
    runs of this drafter and target learned; None: the priors as given). The model still starts
    from the priors as given and moves there with its first refit, once this run's own outcomes
    are in: a calibration learned on other prompts is confirmed before it is bet on (started
    there, the simulation lost up to 9% to plain decoding on a prompt unlike the earlier ones; started
    at a mixture of the two weighed by this run's evidence, 11% of a steep curve's 256-token answers).
    That refit comes after ``_REFIT_EVERY`` updates, or as soon as this run's outcomes favour the
    remembered calibration over the priors as given by the likelihood ratio ``early_evidence``
    (6: two right first tokens where the priors said 0.3 and the calibration 0.75): a draft that
    undersells itself was otherwise looked at one token a round for four rounds, 8% of a 64-token
    answer (``ScheduleConstants.early_evidence`` says why 6).
    ``prior_odds``: the odds that the remembered calibration, rather than the priors as given, describes
    this run before any of its outcomes (its track record: calibrations.Stored.odds); the evidence starts at
    their log, so a calibration earlier runs agreed with is taken on less evidence of this run's, and one
    they disagreed with on more (odds at or past ``early_evidence`` start the model at it).
    ``weigh_calibration``: every refit pulls the fit towards the remembered calibration only as far as
    this run's outcomes so far make it the likelier of the two (its posterior weight against the priors
    as given, from ``prior_odds``: even odds for prompt lookup), not all the way once the run has begun (prompt lookup: whether
    an answer copies its input, like the earlier answers, or not is the prompt's, not the model's).
    """

    def __init__(self, priors: Sequence[float], strength: float = 3.0, recency: float = 64.0,
                 calibration: Sequence[float] | None = None, early_evidence: float = 6.0,
                 weigh_calibration: bool = False, prior_odds: float = 1.0) -> None:
        if not len(priors):
            raise ConfigError("an acceptance model needs at least one bucket prior")
        if any(not 0.0 < p < 1.0 for p in priors):
            raise ConfigError(f"bucket priors must lie in (0, 1); got {list(priors)}")
        if strength <= 0 or recency < 1:
            raise ConfigError(f"strength={strength} must be > 0 and recency={recency} >= 1")
        if not early_evidence >= 1.0:  # (also rejects NaN)
            raise ConfigError(f"early_evidence={early_evidence} must be a likelihood ratio >= 1")
        if not 0.0 < prior_odds < math.inf:  # (also rejects NaN)
            raise ConfigError(f"prior_odds={prior_odds} must be a positive finite number")
        centre = _IDENTITY if calibration is None else tuple(float(v) for v in calibration)
        if len(centre) != 4 or not all(math.isfinite(v) for v in centre) or centre[1] < _MIN_SLOPE:
            raise ConfigError(f"calibration={calibration!r} must be four finite numbers (a, s, d1, d2) with s >= "
                              f"{_MIN_SLOPE}")
        self.priors = tuple(float(p) for p in priors)
        self.strength, self.recency = strength, recency
        self._early_evidence = math.log(early_evidence)  # (compared with a log-likelihood ratio)
        self._weigh = weigh_calibration
        self._n = n = len(priors)
        # Slots: bucket b's first tokens at b, its later ones at n + b, its deep ones at 2n + b. Plain
        # lists, not arrays: a round touches a few slots, and numpy's per-call cost (run with caches a
        # pass left cold) made a refit 150-400 us of a tiny model's 200-400 us round.
        self._logit = [math.log(p / (1.0 - p)) for p in priors] * 3
        self._hits = [0.0] * (3 * n)
        self._total = [0.0] * (3 * n)
        self._unverified_hits = [0.0] * (3 * n)  # outcomes seen without verifying (calibration only)
        self._unverified_total = [0.0] * (3 * n)
        self._seen: set[int] = set()  # slots with an outcome, verified or not: what a refit fits
        self._centre = centre
        self.observations = [0] * n  # verified tokens per bucket
        self.outcomes = 0  # every outcome counted, verified or not: what taught the calibration
        self._since_fit = 0
        self._refitted = False
        self.revision = 0  # counts the changes of any bucket's confidence (what readers may cache by)
        self._confidences: dict[int, tuple[int, list[float]]] = {}  # per slot group: (revision, confidences)
        self._apply(_IDENTITY)
        # The log-odds that the remembered calibration, not the priors as given, describes this run: the prior
        # odds' log plus how much better it predicted the outcomes so far (log-likelihood ratio; None: nothing
        # remembered, or no longer read: after the first refit unless weigh_calibration).
        self._evidence: float | None = None if calibration is None else math.log(prior_odds)
        # Per slot, what a hit and a miss add to it.
        self._hit_evidence: list[float] = []
        self._miss_evidence: list[float] = []
        if calibration is not None:
            for slot in range(3 * n):
                remembered, given = (min(max(_sigmoid(self._slot_logit(cal, slot)), 1e-6), 1.0 - 1e-6)
                                     for cal in (centre, _IDENTITY))
                self._hit_evidence.append(math.log(remembered / given))
                self._miss_evidence.append(math.log((1.0 - remembered) / (1.0 - given)))
            if self._evidence >= self._early_evidence:  # (vouched for enough by earlier runs alone)
                self._refit()

    @property
    def centre(self) -> tuple[float, float, float, float]:
        """The calibration the fit is pulled towards (the identity when none was given)."""
        return self._centre

    def evidence_of(self, hits: Sequence[float], outcomes: Sequence[float]) -> float | None:
        """How much better the remembered calibration predicts per-slot ``hits`` of ``outcomes`` (as ``counts``
        gives them) than the priors as given: their log-likelihood ratio (None: nothing remembered)."""
        if not self._hit_evidence:
            return None
        if len(hits) != 3 * self._n or len(outcomes) != 3 * self._n:
            raise ConfigError(f"counts of {len(hits)} and {len(outcomes)} slots given; this model has {3 * self._n}")
        return sum(h * hit + (o - h) * miss for h, o, hit, miss in zip(hits, outcomes, self._hit_evidence,
                                                                     self._miss_evidence))

    @property
    def remembered_unfitted(self) -> bool:
        """Whether a remembered calibration waits for the first refit while outcomes have come in (``fitted``
        would bring it in now)."""
        return self._evidence is not None and not self._refitted and self._since_fit > 0

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
        slot = bucket + self._n * _DEPTH[min(position, 4)]  # (slot_group inline: read per drafted token)
        mean = self._mean[slot]
        if mean is None:  # (computed when first read after a refit: most slots are never read)
            mean = self._mean[slot] = (self._hits[slot] + self.strength * self._pooled_at(slot)) / (
                self._total[slot] + self.strength)
        return mean

    def confidences(self, position: int = 0) -> list[float]:
        """``confidence(bucket, position)`` of every bucket, in bucket order (kept until the next change:
        the caller must not modify it)."""
        group = slot_group(position)
        kept = self._confidences.get(group)
        if kept is None or kept[0] != self.revision:
            kept = self._confidences[group] = (self.revision, [self.confidence(b, position) for b in range(self._n)])
        return kept[1]

    def update(self, buckets: Sequence[int], accepted: int) -> None:
        """A proposal's verified tokens with these buckets: the first ``accepted`` were accepted, the next
        rejected."""
        self._update(buckets[: accepted + 1], [True] * accepted + [False])

    def update_chances(self, buckets: Sequence[int], chances: Sequence[float]) -> None:
        """A sampled proposal's verified tokens with these buckets, up to and including the first rejected
        one, each with its chance of acceptance (min(1, p(x)/q(x))) in place of whether it was accepted."""
        self._update(buckets, chances)

    def _update(self, buckets: Sequence[int], outcomes: Sequence[bool | float]) -> None:
        """Count each verified token's outcome in its bucket's slot for its position."""
        hits, total, n = self._hits, self._total, self._n
        for i, (b, outcome) in enumerate(zip(buckets, outcomes)):
            self.observations[b] += 1
            b += n * slot_group(i)
            self._count(hits, total, b, outcome)
            self._mean[b] = None  # (recomputed when next read: see confidence)
        self.revision += 1
        self._counted()

    def update_hindsight(self, outcomes: Sequence[tuple[int, bool, int]], weight: float) -> None:
        """Outcomes seen in hindsight, each ``(bucket, accepted, position in its proposal)``: a proposal's
        tokens that were not verified, against the tokens the target went on to commit. Each counts as
        ``weight`` of an outcome (those tokens also teach the slots of the proposals that drafted them
        again), in the pooled calibration only, not in the buckets' own counts; together one update."""
        for bucket, hit, position in outcomes:
            self._count(self._unverified_hits, self._unverified_total, bucket + self._n * slot_group(position),
                        hit, weight)
        self._counted()

    def update_calibration(self, bucket: int, accepted: bool | float) -> None:
        """An outcome seen without verifying (a declined greedy proposal's first token against the
        token the plain step produced, or, sampled, the chance it would have been accepted): it moves
        the pooled calibration, not the bucket's own count."""
        self._count(self._unverified_hits, self._unverified_total, bucket, accepted)
        self._counted()

    def _count(self, hits: list[float], total: list[float], slot: int, hit: bool | float,
               weight: float = 1.0) -> None:
        if total[slot] >= self.recency:  # forget a little: keep following recent outcomes
            scale = (self.recency - 1.0) / total[slot]
            hits[slot] *= scale
            total[slot] *= scale
        hit = float(hit)  # (a chance of acceptance counts as that share of a hit)
        hits[slot] += weight * hit
        total[slot] += weight
        self._seen.add(slot)
        self.outcomes += 1
        if self._evidence is not None:
            self._evidence += weight * (hit * self._hit_evidence[slot] + (1.0 - hit) * self._miss_evidence[slot])

    def _counted(self) -> None:
        self._since_fit += 1
        if self._since_fit >= _REFIT_EVERY or self._evidence is not None and not self._refitted \
                and self._evidence >= self._early_evidence:
            self._refit()

    def own_fit(self) -> tuple[float, float, float, float]:
        """What this run's outcomes say of the pooled calibration on their own: fitted around the priors as
        given, not around a remembered calibration (what a store of calibrations should blend: fits
        centred on what the store held compound, run after run)."""
        return self._fit(_IDENTITY, _IDENTITY)

    def counts(self) -> tuple[list[float], list[float]]:
        """Per slot (bucket b's first tokens at b, later ones at n + b, deep ones at 2n + b), the hits and
        outcomes the pooled calibration is fitted to, verified or not."""
        hits = [h + u for h, u in zip(self._hits, self._unverified_hits)]
        return hits, [t + u for t, u in zip(self._total, self._unverified_total)]

    def fit_counts(self, hits: Sequence[float], outcomes: Sequence[float]) -> tuple[float, float, float, float]:
        """What per-slot ``hits`` and ``outcomes`` (as ``counts`` gives them, for this model's buckets) say of
        the pooled calibration on their own, fitted around the priors as given (as own_fit)."""
        if len(hits) != 3 * self._n or len(outcomes) != 3 * self._n:
            raise ConfigError(f"counts of {len(hits)} and {len(outcomes)} slots given; this model has {3 * self._n}")
        return self._fit(_IDENTITY, _IDENTITY, (hits, outcomes))

    def _refit(self) -> None:
        """Refit the pooled calibration around the centre (see _fit) and make it the estimate."""
        self._since_fit = 0
        centre: Sequence[float] = self._centre
        if not self._weigh:
            self._evidence = None  # (the fit weighs this run's outcomes from now on)
        elif self._evidence is not None:
            weight = _sigmoid(self._evidence)  # (the remembered calibration's posterior weight)
            centre = tuple(given + weight * (remembered - given) for given, remembered in zip(_IDENTITY, centre))
        self._refitted = True
        self._apply(self._fit(centre, self.calibration))

    def _fit(self, centre: Sequence[float], start: Sequence[float],
             counts: tuple[Sequence[float], Sequence[float]] | None = None) -> tuple[float, float, float, float]:
        """Fit (a, s, d₁, d₂) by a few Newton steps from ``start`` on all buckets' counts (or the per-slot
        (hits, outcomes) ``counts``), with a Gaussian prior at ``centre`` (precisions 1, 4, 1, 1: 1 / how far
        the data may move a, s, d₁ and d₂)."""
        n, exp, logit = self._n, math.exp, self._logit
        # Per slot group (first, later, deep tokens), its seen slots' (outcomes, hits, logit of the prior).
        groups: tuple[list[tuple[float, float, float]], ...] = ([], [], [])
        if counts is None:
            hits, total, u_hits, u_total = self._hits, self._total, self._unverified_hits, self._unverified_total
            for i in sorted(self._seen):
                groups[i // n].append((total[i] + u_total[i], hits[i] + u_hits[i], logit[i]))
        else:
            for i, (y, count) in enumerate(zip(*counts)):
                if count > 0:
                    groups[i // n].append((float(count), float(y), logit[i]))
        a, s, d1, d2 = start
        ca, cs, c1, c2 = centre
        for _ in range(4):
            # The features are (1, logit, later, deep), later and deep 0/1 with deep ⊂ later: the gradient
            # and the Hessian reduce to sums of r, r·l, w, w·l and w·l² per slot group.
            sums = []
            for group, rows in enumerate(groups):
                base = a + (d1 if group else 0.0) + (d2 if group == 2 else 0.0)
                sw = swl = swll = sr = srl = 0.0
                for count, y, l in rows:
                    z = base + s * l
                    p = 1.0 / (1.0 + exp(-z)) if z > -700.0 else 0.0
                    expected = count * p
                    w = expected * (1.0 - p)
                    sw += w
                    swl += w * l
                    swll += w * l * l
                    sr += y - expected
                    srl += (y - expected) * l
                sums.append((sw, swl, swll, sr, srl))
            (w0, wl0, wll0, r0, rl0), (w1, wl1, wll1, r1, rl1), (w2, wl2, wll2, r2, rl2) = sums
            later_w, later_wl = w1 + w2, wl1 + wl2
            hess = [[w0 + later_w + 1.0, wl0 + later_wl, later_w, w2],
                    [wl0 + later_wl, wll0 + wll1 + wll2 + 4.0, later_wl, wl2],
                    [later_w, later_wl, later_w + 1.0, w2],
                    [w2, wl2, w2, w2 + 1.0]]
            grad = [r0 + r1 + r2 - (a - ca), rl0 + rl1 + rl2 - 4.0 * (s - cs), r1 + r2 - (d1 - c1), r2 - (d2 - c2)]
            step = _solve_spd(hess, grad)
            a, s, d1, d2 = a + step[0], s + step[1], d1 + step[2], d2 + step[3]
        s = max(s, _MIN_SLOPE)  # the prior's order must stay: a surer bucket never becomes a less sure one
        return (a, s, d1, d2)

    def _apply(self, calibration: Sequence[float]) -> None:
        """Make ``calibration`` the pooled estimate; every slot's posterior mean follows when next read."""
        a, s, d1, d2 = calibration
        self.calibration = (float(a), float(s), float(d1), float(d2))
        self.revision += 1
        self._pooled: list[float | None] = [None] * (3 * self._n)
        self._mean: list[float | None] = [None] * (3 * self._n)

    def _pooled_at(self, slot: int) -> float:
        """The slot's acceptance as the pooled calibration says (before its own counts)."""
        pooled = self._pooled[slot]
        if pooled is None:
            pooled = self._pooled[slot] = _sigmoid(self._slot_logit(self.calibration, slot))
        return pooled

    def _slot_logit(self, calibration: Sequence[float], slot: int) -> float:
        """The slot's log-odds of acceptance as ``calibration`` says."""
        a, s, d1, d2 = calibration
        group = slot // self._n
        return a + s * self._logit[slot] + (d1 if group else 0.0) + (d2 if group == 2 else 0.0)


def _sigmoid(z: float) -> float:
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)  # (for z < 0: exp(-z) could overflow)
    return e / (1.0 + e)


def _solve_spd(a: list[list[float]], b: list[float]) -> list[float]:
    """x with ``a x = b`` for a small symmetric positive definite ``a`` (Cholesky, in place: ``a``'s lower
    triangle becomes the factor)."""
    size = len(b)
    for j in range(size):
        row = a[j]
        d = row[j]
        for k in range(j):
            d -= row[k] * row[k]
        d = row[j] = math.sqrt(d)
        for i in range(j + 1, size):
            other = a[i]
            v = other[j]
            for k in range(j):
                v -= other[k] * row[k]
            other[j] = v / d
    y = list(b)
    for i in range(size):  # L y = b
        row = a[i]
        v = y[i]
        for k in range(i):
            v -= row[k] * y[k]
        y[i] = v / row[i]
    for i in reversed(range(size)):  # Lᵀ x = y
        v = y[i]
        for k in range(i + 1, size):
            v -= a[k][i] * y[k]
        y[i] = v / a[i][i]
    return y
