"""Seeded statistical tests: speculative sampling has exactly the target's sampling distribution.

The reference is exact: the joint distribution of the first K + 1 = 4 tokens under the
target's own sequential sampling, enumerated over a 5-token vocabulary (625 cells). The
decoder drafts K = 3 tokens in its first round, so acceptance at slots 1-3, the residual
after an accepted prefix and the bonus after three accepted tokens all shape the joint.
A chi-square test compares the decoder's seeded samples with it, for both drafters, every
filter, and the adaptive schedule. Each verification rule has a negative control: the
same test, run against a deliberately broken rule, must give a tiny p-value.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import numpy as np
import pytest

import specdec_gguf.decoder as decoder_module
import specdec_gguf.drafters.autoregressive as autoregressive_module
import specdec_gguf.sampling as sampling_module
from specdec_gguf import SamplingParams, SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engine import DrafterBase
from specdec_gguf.engines import InMemoryEngine
from specdec_gguf.sampling import probs_from_logits

from specdec_gguf.profile import CostProfile
from specdec_gguf.proposal import DraftProposal
from specdec_gguf.schedule import AdaptiveSchedule, FixedSchedule

from sampling_harness import CostedEngine, FakeClock, allowed_tokens, chi_square_p_value, target_joint

VOCAB = 5
K = 3  # drafted slots in the first round
N_OUT = K + 1  # tokens compared: three drafted slots plus the bonus
TRIALS = 2000
PASS_P = 1e-3  # a correct decoder is rejected at this level with probability 0.1% (and the seeds are fixed)
FAIL_P = 1e-6  # a broken rule must be this far out
TARGET_SEED, SHARPNESS, DRAFT_NOISE = 107, 1.0, 0.8


def make_target() -> InMemoryEngine:
    return InMemoryEngine.random(VOCAB, seed=TARGET_SEED, sharpness=SHARPNESS)


def make_draft(target: InMemoryEngine) -> InMemoryEngine:
    return target.perturbed(DRAFT_NOISE, seed=4)  # agrees often, not always: every path is exercised


def lookup_prompt(target: InMemoryEngine) -> list[int]:
    """A prompt ending on a bigram seen before, followed there by the target's own greedy path.

    Prompt lookup then proposes K tokens the target finds likely, so whole proposals are
    often accepted and the bonus after K accepted tokens is drawn often.
    """
    path = [4, 2]
    while len(path) < 2 + K:
        path.append(int(np.argmax(target.logits_for(path))))
    return path + [0, 4, 2]


PROMPT = lookup_prompt(make_target())


def sample_counts(decoder: SpeculativeDecoder, params: SamplingParams,
                  trials: int = TRIALS) -> tuple[np.ndarray, list[int]]:
    """Counts of the decoder's first N_OUT tokens over seeded trials, and slots drafted over all trials."""
    counts = np.zeros((VOCAB,) * N_OUT)
    drafted = [0] * K
    for trial in range(trials):
        seeded = dataclasses.replace(params, seed=trial)
        result = decoder.generate(PROMPT, N_OUT, seeded)
        counts[tuple(result.tokens)] += 1
        for i, n in enumerate(result.stats.per_position_drafted[:K]):
            drafted[i] += n
    return counts, drafted


# Strong filters: the "q rows unfiltered" bug biases the output by the mass the filter
# removes from q, so mild filters (top-p 0.9, min-p 0.1) would hide it at this sample size.
PARAMS = {
    "temperature": SamplingParams(temperature=1.0),
    "top_k": SamplingParams(temperature=1.0, top_k=2),
    "top_p": SamplingParams(temperature=1.3, top_p=0.7),
    "min_p": SamplingParams(temperature=1.0, min_p=0.3),
}
FILTERS = ["top_k", "top_p", "min_p"]


def reference(params: SamplingParams) -> np.ndarray:
    return target_joint(make_target(), PROMPT, params, N_OUT)


def make_drafter(kind: str, target: InMemoryEngine):
    return AutoregressiveDrafter(make_draft(target)) if kind == "draft-model" else PromptLookupDrafter(3, 1)


def p_value(kind: str, params: SamplingParams, **decoder_kwargs) -> tuple[float, list[int]]:
    """Run the seeded trials for one drafter and return the p-value and the slots drafted."""
    target = make_target()
    decoder = SpeculativeDecoder(target, make_drafter(kind, target), **{"num_draft_tokens": K, "adaptive": False, **decoder_kwargs})
    counts, drafted = sample_counts(decoder, params)
    return chi_square_p_value(counts, reference(params)), drafted


# -- the decoder is exact ---------------------------------------------------------------------

@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup"])
def test_first_k_plus_one_tokens_follow_the_target(kind, params):
    """Fails for every broken rule below (see the negative controls)."""
    p, drafted = p_value(kind, params)
    assert drafted[K - 1] >= TRIALS  # every first round drafted all K slots
    assert p > PASS_P


@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup"])
def test_adaptive_schedule_is_exact(kind):
    """The adaptive schedule picks k per round from costs and acceptance; the output stays exact.

    The engines charge a fake clock for each pass (the target's pass is expensive, a draft
    model's cheap), so the schedule's choices, and this test, are deterministic. Fails with
    the residual replaced by p (test_adaptive_negative_control).
    """
    p, drafted = adaptive_p_value(kind, SamplingParams(temperature=1.0, top_p=0.9))
    # The costs are set so the schedule mixes k = 1, 2 and 3 (with the current schedule:
    # draft model [2666, 2206, 873], prompt lookup [2642, 2637, 1930] per slot over all trials).
    assert drafted[K - 1] >= TRIALS // 10, f"the schedule hardly drafted {K} slots: {drafted}"
    assert drafted[0] > drafted[K - 1], f"the schedule always drafted {K}: {drafted}"
    assert p > PASS_P


TARGET_PASS, TARGET_PER_TOKEN, DRAFT_PASS = 1e-3, 1.5e-4, 3e-4  # fake seconds


def adaptive_p_value(kind: str, params: SamplingParams) -> tuple[float, list[int]]:
    """Seeded trials through an adaptive decoder on a fake clock.

    InMemoryEngine is not a TextModel, so the decoder would find no cost profile for it and,
    assuming linear costs, never draft; the schedule gets the fake costs' profile instead.
    """
    clock = FakeClock()
    target = CostedEngine(make_target(), clock, per_pass=TARGET_PASS, per_token=TARGET_PER_TOKEN)
    profile = CostProfile({n: TARGET_PASS + TARGET_PER_TOKEN * n for n in range(1, K + 2)})
    if kind == "draft-model":
        drafter = AutoregressiveDrafter(CostedEngine(make_draft(make_target()), clock, per_pass=DRAFT_PASS,
                                                     per_token=0.0))
        draft_costs = CostProfile({1: DRAFT_PASS})
    else:
        drafter, draft_costs = PromptLookupDrafter(3, 1), None
    schedule = AdaptiveSchedule(K, target_costs=profile, draft_costs=draft_costs, free_drafter=draft_costs is None,
                                priors={greedy: drafter.acceptance_priors(greedy) for greedy in (True, False)})
    decoder = SpeculativeDecoder(target, drafter, num_draft_tokens=K, schedule=schedule, clock=clock)
    counts, drafted = sample_counts(decoder, params)
    return chi_square_p_value(counts, reference(params)), drafted


def test_plain_sampling_matches_the_reference():
    """The harness itself: the target alone (no drafter) passes against the enumerated reference.

    Fails if the reference ignored the filters (the support check in the next test fails too).
    """
    params = PARAMS["top_p"]
    target = make_target()
    counts, _ = sample_counts(SpeculativeDecoder(target), params)
    assert chi_square_p_value(counts, reference(params)) > PASS_P


@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
def test_reference_support_is_what_the_filters_allow(params):
    """The reference gives mass to exactly the sequences whose every token survives the filters
    in its context (checked against an independent float64 definition), and sums to 1.

    Fails if target_joint or probs_from_logits dropped a filter, or kept a token a filter removes.
    """
    target = make_target()
    joint = reference(params)
    for cell in itertools.product(range(VOCAB), repeat=N_OUT):
        reachable = all(cell[i] in allowed_tokens(target.logits_for(PROMPT + list(cell[:i])), params)
                        for i in range(N_OUT))
        assert (joint[cell] > 0) == reachable, cell
    assert joint.sum() == pytest.approx(1.0, abs=1e-5)  # float32 rows
    if params.top_k or params.top_p < 1 or params.min_p:
        assert np.count_nonzero(joint) < VOCAB ** N_OUT  # the filter does cut here


def test_q_without_filters_is_still_exact(monkeypatch):
    """Chen et al. hold for any draft distribution q, as long as the token is drawn from the q
    the verifier sees: a drafter that ignores the filters (consistently) is slower, not wrong.

    This is why the "filters on p but not on q" negative control below breaks the consistency
    (q's rows lose the filters, the draws keep them) rather than dropping the filters from q.
    """
    params = PARAMS["top_k"]
    unfiltered = SamplingParams(temperature=params.temperature)
    real = autoregressive_module.probs_from_logits
    monkeypatch.setattr(autoregressive_module, "probs_from_logits", lambda logits, _params: real(logits, unfiltered))
    p, drafted = p_value("draft-model", params)
    assert drafted[K - 1] >= TRIALS
    assert p > PASS_P


# -- negative controls: each broken rule is caught ----------------------------------------------

def broken_rejection_sample(accept_rule: str) -> Callable:
    """rejection_sample (sampling.py) with another acceptance test: 'q/p' accepts with
    min(1, q(x)/p(x)), 'p' with p(x) (q ignored). The rest is the real rule."""
    def rejection_sample(draft_tokens, draft_probs, target_logits, params, rng, refused_row=None, chances=None):
        for i, token in enumerate(draft_tokens):
            target_probs = probs_from_logits(target_logits[i], params)
            draft_row = draft_probs[i] if draft_probs is not None else None
            q_x = float(draft_row[token]) if draft_row is not None else 1.0
            p_x = float(target_probs[token])
            accept = (min(1.0, q_x / p_x) if p_x > 0 else 0.0) if accept_rule == "q/p" else p_x
            if chances is not None:
                chances.append(accept)
            if rng.random() < accept:
                continue
            return i, sampling_module.sample(sampling_module.residual_probs(target_probs, draft_row, token), rng)
        k = len(draft_tokens)
        return k, sampling_module.sample(probs_from_logits(target_logits[k], params), rng)
    return rejection_sample


def _shifted_rows(target_logits: np.ndarray) -> np.ndarray:
    """Slot i verified against target row i + 1 (the anchor's row forgotten); the bonus keeps the last row."""
    return np.concatenate([target_logits[1:], target_logits[-1:]])


def _bonus_from_previous_row(target_logits: np.ndarray) -> np.ndarray:
    """The bonus (row k) drawn from row k - 1, the last drafted slot's distribution."""
    return np.concatenate([target_logits[:-1], target_logits[-2:-1]]) if len(target_logits) > 1 else target_logits


def break_rule(monkeypatch, bug: str, params: SamplingParams) -> None:
    """Install one deliberately broken verification rule."""
    real = sampling_module.rejection_sample
    if bug == "ratio q/p":
        monkeypatch.setattr(sampling_module, "rejection_sample", broken_rejection_sample("q/p"))
    elif bug == "ratio p":
        monkeypatch.setattr(sampling_module, "rejection_sample", broken_rejection_sample("p"))
    elif bug == "residual is p":
        monkeypatch.setattr(sampling_module, "residual_probs", lambda target_probs, draft_row, token: target_probs)
    elif bug == "bonus row":
        monkeypatch.setattr(sampling_module, "rejection_sample",
                            lambda tokens, q, logits, *a, **kw: real(tokens, q, _bonus_from_previous_row(logits), *a, **kw))
    elif bug == "rows off by one":
        monkeypatch.setattr(sampling_module, "rejection_sample",
                            lambda tokens, q, logits, *a, **kw: real(tokens, q, _shifted_rows(logits), *a, **kw))
    elif bug == "p unfiltered":
        # The verifier's p drops the filters (the drafter's q keeps them).
        unfiltered = SamplingParams(temperature=params.temperature)
        real_probs = sampling_module.probs_from_logits
        monkeypatch.setattr(sampling_module, "probs_from_logits", lambda logits, _params: real_probs(logits, unfiltered))
    elif bug == "q rows unfiltered":
        # The draft token is drawn from the filtered q, but the rows handed to verification lack the filters.
        unfiltered = SamplingParams(temperature=params.temperature)
        real_probs, real_sample = autoregressive_module.probs_from_logits, autoregressive_module.sample
        monkeypatch.setattr(autoregressive_module, "probs_from_logits",
                            lambda logits, _params: real_probs(logits, unfiltered))
        filters_only = dataclasses.replace(params, temperature=1.0)  # the rows are already tempered
        monkeypatch.setattr(autoregressive_module, "sample",
                            lambda probs, rng: real_sample(real_probs(np.log(probs), filters_only), rng))
    else:
        raise ValueError(bug)


NEGATIVE = [
    # (bug, drafter, filter): a deterministic drafter has q one-hot, so "ratio p" and the
    # q-row bug change nothing there (p(x)/1 == p(x)) and are run on the draft model only.
    ("ratio q/p", "draft-model", "temperature"),
    ("ratio q/p", "prompt-lookup", "temperature"),
    ("ratio p", "draft-model", "temperature"),
    ("residual is p", "draft-model", "temperature"),
    ("residual is p", "prompt-lookup", "temperature"),
    ("bonus row", "draft-model", "temperature"),
    ("bonus row", "prompt-lookup", "temperature"),
    ("rows off by one", "draft-model", "temperature"),
    ("rows off by one", "prompt-lookup", "temperature"),
    ("p unfiltered", "draft-model", "top_p"),
    ("p unfiltered", "prompt-lookup", "min_p"),
    *[("q rows unfiltered", "draft-model", f) for f in FILTERS],
]


@pytest.mark.parametrize("bug, kind, filter_name", NEGATIVE, ids=[" / ".join(n) for n in NEGATIVE])
def test_negative_control(monkeypatch, bug, kind, filter_name):
    """Proof the exactness test can fail: the same test against a broken rule gives a tiny p-value."""
    params = PARAMS[filter_name]
    break_rule(monkeypatch, bug, params)
    p, _ = p_value(kind, params)
    assert p < FAIL_P


@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup"])
def test_adaptive_negative_control(monkeypatch, kind):
    """The adaptive test can fail too: the residual replaced by p."""
    break_rule(monkeypatch, "residual is p", SamplingParams(temperature=1.0))
    p, _ = adaptive_p_value(kind, SamplingParams(temperature=1.0, top_p=0.9))
    assert p < FAIL_P


def test_seeded_sampling_is_reproducible(target, draft):
    decoder = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    runs = [decoder.generate([1, 2], 50, params).tokens for _ in range(2)]
    assert runs[0] == runs[1]
    other = decoder.generate([1, 2], 50, SamplingParams(temperature=0.9, top_p=0.95, seed=99)).tokens
    assert other != runs[0]


# -- a schedule reading the drawn tokens cannot bias the output -------------------------------

class SureTokensOnly(FixedSchedule):
    """Drafts ``k`` tokens and verifies them only up to the first one the draft gave q(x) < 0.5: the
    kind of choice a schedule makes from a proposal's confidence (the adaptive schedule's buckets).

    For a drawn token, q(x) is part of the draw: verifying x only when q(x) is high skews which
    tokens reach verification, where a plain step drawing from p stands in for the others.
    """

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.cut = 0  # proposals it would cut past their first token
        self.declined = 0

    @staticmethod
    def sure_prefix(proposal) -> int:
        rows = proposal.draft_probs
        if rows is None:
            return len(proposal.tokens)
        sure = [float(rows[i][t]) >= 0.5 for i, t in enumerate(proposal.tokens)]
        return sure.index(False) if False in sure else len(sure)

    def choose(self, proposal, greedy: bool) -> int:
        return self.sure_prefix(proposal)

    def observe(self, proposal, verified, *args, **kwargs) -> None:
        self.cut += 0 < self.sure_prefix(proposal) < len(proposal.tokens)
        self.declined += bool(proposal.tokens) and not verified


def sure_tokens_p_value(k: int) -> tuple[float, SureTokensOnly]:
    target = make_target()
    schedule = SureTokensOnly(k)
    decoder = SpeculativeDecoder(target, make_drafter("draft-model", target), num_draft_tokens=K,
                                 schedule=schedule)
    params = PARAMS["temperature"]
    counts, _ = sample_counts(decoder, params)
    return chi_square_p_value(counts, reference(params)), schedule


def test_a_schedule_reading_drawn_tokens_cannot_skew_the_output():
    """A drawn proposal is verified whole (its length was settled while drawing it, from what was drawn
    so far), and a one-token one declined (its token alone decides) is verified by the plain step
    against its own row: no choice made from the drawn tokens themselves skews the output. Fails when
    the decoder cuts drawn proposals where the schedule says, or a declined round draws from p
    (test_reading_drawn_tokens_skews_the_output_unless_guarded)."""
    p, schedule = sure_tokens_p_value(K)
    assert schedule.cut >= TRIALS // 4, f"the schedule hardly wanted a cut ({schedule.cut}): the test shows nothing"
    assert p > PASS_P
    p, schedule = sure_tokens_p_value(1)
    assert schedule.declined >= TRIALS // 4, f"the schedule hardly declined ({schedule.declined})"
    assert p > PASS_P


def _declined_from_p(token, draft_row, target_logits, params, rng):
    return sampling_module.sample_declined(token, draft_row, target_logits, params, rng)


@pytest.mark.parametrize("guard, k", [("verified whole", K), ("declined token verified", 1)])
def test_reading_drawn_tokens_skews_the_output_unless_guarded(monkeypatch, guard, k):
    """The negative controls: honour the schedule's cut of a drawn proposal, or draw a declined round's
    token from p (as if declining had been settled before the draw), and the output is skewed."""
    if guard == "verified whole":
        monkeypatch.setattr(decoder_module, "_drawn", lambda proposal: False)
    else:
        monkeypatch.setattr(sampling_module, "verify_declined", _declined_from_p)
    p, _ = sure_tokens_p_value(k)
    assert p < FAIL_P


# -- a drawn id outside the target's vocabulary --------------------------------------------------

class WideDrafter(DrafterBase):
    """Draws K tokens independently from one fixed q over the target's vocabulary plus two more ids
    (a draft vocabulary may be larger than the target's), a third of q's mass on those two."""

    name = "wide"

    def __init__(self) -> None:
        self.q = np.array([0.3, 0.2, 0.1, 0.05, 0.02, 0.2, 0.13])  # ids 5 and 6: past the target's vocabulary

    def start(self, prompt_tokens) -> None:
        pass

    def propose(self, max_tokens, policy, rng, budget=None) -> DraftProposal:
        tokens = [sampling_module.sample(self.q, rng) for _ in range(max_tokens)]
        return DraftProposal(tokens=tuple(tokens), draft_probs=np.tile(self.q, (len(tokens), 1)))

    def accept(self, n_accepted, committed) -> None:
        pass


def wide_p_value() -> float:
    target = make_target()
    decoder = SpeculativeDecoder(target, WideDrafter(), num_draft_tokens=K, adaptive=False)
    params = PARAMS["temperature"]
    counts, _ = sample_counts(decoder, params)
    return chi_square_p_value(counts, reference(params))


def test_a_drawn_id_the_target_cannot_take_is_rejected_not_skipped():
    """Verification stops before such an id (the target cannot take it), but as a drawn token it
    counts as rejected (p gives it 0): the next token comes from the residual with its q row, so the
    output stays exact. Fails when the token after the cut is drawn from p
    (test_drawing_from_p_after_a_foreign_id_is_biased)."""
    assert wide_p_value() > PASS_P


def test_drawing_from_p_after_a_foreign_id_is_biased(monkeypatch):
    """The negative control: forget the cut id's q row, and the output is skewed."""
    real = decoder_module._fit_to_target
    monkeypatch.setattr(decoder_module, "_fit_to_target", lambda proposal, n_vocab: (real(proposal, n_vocab)[0], None))
    assert wide_p_value() < FAIL_P
