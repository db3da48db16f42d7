"""PromptLookupDrafter on hand-made contexts."""

from __future__ import annotations

import random

import pytest

from specdec_gguf import ConfigError
from specdec_gguf.drafters import PromptLookupDrafter


def propose(context: list[int], k: int, **kwargs) -> list[int]:
    drafter = PromptLookupDrafter(**kwargs)
    drafter.start(context)
    return list(drafter.propose(k).tokens)


def test_copies_what_followed_the_tail():
    assert propose([1, 2, 3, 4, 5, 9, 1, 2, 3], 2, max_ngram=3) == [4, 5]


def test_longest_ngram_wins_over_more_recent_shorter_match():
    # "3" recently followed by 7, but "2 3" earlier followed by 4: the trigram/bigram wins.
    assert propose([2, 3, 4, 0, 3, 7, 2, 3], 1, max_ngram=2) == [4]


def test_most_recent_match_first():
    assert propose([5, 6, 1, 5, 6, 2, 5, 6], 1, max_ngram=2) == [2]


def test_no_match_gives_empty_proposal():
    assert propose([1, 2, 3, 4], 3) == []


def test_min_ngram_limits_short_matches():
    assert propose([1, 2, 9, 2], 1, max_ngram=3, min_ngram=2) == []
    assert propose([1, 2, 9, 2], 1, max_ngram=3, min_ngram=1) == [9]


def test_proposal_is_clipped_by_k_and_num_pred_tokens():
    ctx = [1, 2, 3, 4, 5, 6, 1, 2]
    assert propose(ctx, 3) == [3, 4, 5]
    assert propose(ctx, 10, num_pred_tokens=2) == [3, 4]
    assert propose(ctx, 10) == [3, 4, 5, 6, 1, 2]  # runs to the end of the context


def test_index_follows_committed_tokens():
    drafter = PromptLookupDrafter(max_ngram=2)
    drafter.start([1, 2, 3])
    assert drafter.propose(2).tokens == ()
    drafter.accept(0, [1, 2])
    assert drafter.propose(2).tokens == (3, 1)


@pytest.mark.parametrize("paused", [True, False])
def test_the_first_round_asked_after_a_pause_searches(paused):
    """Searches that keep finding nothing back off (a search and its bookkeeping are 5-10% of a tiny
    model's round): after six misses the next two rounds asked don't search. Rounds the drafter is
    told of but not asked for (a pause) spaced its searches already, so the first round asked after
    one searches, and finds a copy that began during it. Negative control: the same round asked
    (a skipped search) leaves the back-off running. Fails if a pause's rounds left the back-off as it was."""
    drafter = PromptLookupDrafter()
    drafter.start(list(range(100, 120)))
    for token in range(6):
        assert drafter.propose(4).tokens == ()
        drafter.accept(0, [token])
    if not paused:
        assert drafter.propose(4).tokens == ()
    drafter.accept(0, [100, 101])
    assert drafter.propose(4).tokens == ((102, 103, 104, 105) if paused else ())


@pytest.mark.parametrize("kwargs", [{"min_ngram": 0}, {"max_ngram": 1, "min_ngram": 2},
                                    {"num_pred_tokens": 0}])
def test_bad_settings(kwargs):
    with pytest.raises(ConfigError):
        PromptLookupDrafter(**kwargs)


def test_the_full_match_length_decides_not_the_key_length():
    """Both occurrences of the tail bigram (7 8) match it, but the older one matches 5 tokens back:
    its continuation wins. Fails if the drafter took the most recent key match (llama-cpp-python's rule)."""
    ctx = [1, 2, 3, 7, 8, 40, 41, 9, 7, 8, 50, 1, 2, 3, 7, 8]
    assert propose(ctx, 2, max_ngram=2) == [40, 41]


def test_following_a_source_needs_no_search():
    """While committed tokens follow the source, the next proposal continues from it."""
    drafter = PromptLookupDrafter(max_ngram=2)
    drafter.start([10, 11, 12, 13, 14, 15, 16, 10, 11])
    assert drafter.propose(3).tokens == (12, 13, 14)
    drafter.accept(2, [12, 13, 14])
    assert drafter.propose(2).tokens == (15, 16)
    drafter.accept(0, [99])  # the target went elsewhere: the source is dropped, a search finds nothing
    assert drafter.propose(2).tokens == ()


def test_memory_drafts_from_earlier_generations():
    """With memory, a second request that quotes the first drafts from it; without, it can't."""
    first = list(range(100, 160))
    second = [7, 8] + first[10:20]
    for memory, expected in ((0, ()), (1000, tuple(first[20:24]))):
        drafter = PromptLookupDrafter(max_ngram=3, memory_tokens=memory)
        drafter.start(first[:30])
        drafter.accept(0, first[30:])
        drafter.start(second)
        assert drafter.propose(4).tokens == expected


def test_memory_is_bounded_and_never_crosses_documents():
    drafter = PromptLookupDrafter(max_ngram=2, memory_tokens=100)
    for doc in range(20):
        drafter.start([1000 + doc * 50 + i for i in range(40)] + [5, 6])
    drafter.start([0])
    remembered = [t for t in drafter._memory.tokens if t != -1]
    assert len(remembered) <= 100
    drafter.start([5, 6])  # "5 6" ends every remembered document: there is no continuation past it
    assert drafter.propose(3).tokens == ()


def test_index_memory_is_linear_in_the_context():
    """The old index stored every n-gram as a tuple key: 558 MB for a 702-token prompt at ngram_max 1e6.
    Now n is bounded (16) and keys are hashes: memory per token is a small constant."""
    import tracemalloc

    import numpy as np

    tokens = [int(t) for t in np.random.default_rng(0).integers(0, 50, 4000)]
    tracemalloc.start()
    drafter = PromptLookupDrafter(max_ngram=16)
    drafter.start(tokens)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert size / len(tokens) < 16 * 100  # bytes per token: about one dict slot, key and position per n
    with pytest.raises(ConfigError, match="max_ngram"):
        PromptLookupDrafter(max_ngram=1_000_000)


def _copy_rounds(drafter: PromptLookupDrafter, prompt: list[int], output: list[int], k: int = 8) -> list[int]:
    """Greedy rounds against a known output, as the decoder runs them: the source tokens each rejected
    proposal had where the output went elsewhere."""
    drafter.start(prompt)
    done, rejected = 0, []
    while done < len(output):
        proposal = drafter.propose(k).tokens
        accepted = 0
        while accepted < len(proposal) and done + accepted < len(output) and proposal[accepted] == output[done + accepted]:
            accepted += 1
        if accepted < len(proposal) and done + accepted < len(output):
            rejected.append(proposal[accepted])
        committed = output[done:done + accepted + 1]
        drafter.accept(accepted, committed)
        done += len(committed)
    return rejected


USERS, RECORDS = 50, 60
LEAD = [100, 101, 102, 103, 104, 105, 106, 107, 108, 109]  # copied first: an edit needs a copy run to learn from
SOURCE = LEAD + [1, 2, 3, USERS, 4, 5, 6, USERS, 7, 8, 9, USERS, 10, 11]


def test_a_copy_with_a_rename_learns_the_rename():
    """The output copies the source with every USERS renamed to RECORDS: the first rename is a surprise;
    the proposal before the second stops there (the target's own token confirms the rename) and the
    third is drafted. Fails without edits (all three proposals say USERS)."""
    output = [RECORDS if t == USERS else t for t in SOURCE]
    drafter = PromptLookupDrafter()
    assert _copy_rounds(drafter, SOURCE + [200, 201], output) == [USERS]
    drafter.start(SOURCE + [200, 201])  # a new generation: edits belong to the one they were seen in
    assert drafter._edits == {}


def test_an_edit_the_output_does_not_make_again_costs_nothing():
    """Only the first occurrence is renamed: at the second the proposal stops before the span, the
    target keeps USERS, the edit is forgotten and the copy goes on from the source (the third
    occurrence, changed to 70, is an ordinary surprise). Fails if unconfirmed edits were drafted
    (RECORDS rejected at the second occurrence)."""
    first, second, third = (i for i, t in enumerate(SOURCE) if t == USERS)
    output = list(SOURCE)
    output[first] = RECORDS
    output[third] = 70
    assert _copy_rounds(PromptLookupDrafter(), SOURCE + [200, 201], output) == [USERS, USERS]


def test_multi_token_edits_are_learned_but_not_deletions():
    """A two-token span replaced by three tokens is learned from the first occurrence and proposed at
    the second. A deletion is not learned: a span dropped once (a common token in an edit) is rarely
    dropped everywhere, and proposing it dropped cost a rejection each time."""
    a, b = 30, 31
    source = LEAD + [1, 2, a, b, 3, 4, 5, 6, a, b, 7, 8, 9, 10]
    longer = [x for t in source for x in ((61, 62, 63) if t == a else () if t == b else (t,))]
    assert _copy_rounds(PromptLookupDrafter(), source + [200, 201], longer) == [a]
    shorter = [t for t in source if t not in (a, b)]
    assert _copy_rounds(PromptLookupDrafter(), source + [200, 201], shorter) == [a, a]


def test_an_edit_in_open_text_is_not_learned():
    """A chance match (fewer than 8 tokens followed) that the output leaves is no copy: nothing learned."""
    source = [1, 2, 3, USERS, 4, 5, 6, 7, USERS, 8, 9]
    output = [RECORDS if t == USERS else t for t in source]
    assert _copy_rounds(PromptLookupDrafter(), source + [200, 201], output).count(USERS) == 2


class _StrictBudget:
    """A schedule that trusts only the longest matches (a steep CPU curve): short matches aren't searched."""

    min_confidence = 0.99
    step_seconds = 1e-4  # (a small model's plain step: a search for every match would cost too much beside it)

    def confidence(self, bucket: int, position: int = 0) -> float:
        return 0.5


S = list(range(1, 41))  # a source of distinct tokens


def _leave_and_write(copied: int, written: list[int]) -> list[tuple[int, ...]]:
    """The output copied ``S[:copied]``, left it where a proposal continued, then wrote ``written``
    one plain step at a time: the proposals made after each step."""
    drafter = PromptLookupDrafter()
    drafter.start(S + list(range(300, 400)) + S[:copied])  # (other text between source and copy)
    assert drafter.propose(8).tokens == tuple(S[copied:copied + 8])  # the copy (any match will do here)
    proposals = []
    for token in written:
        drafter.accept(0, [token])  # the first drafted token rejected (or a plain step): the target's own
        proposals.append(drafter.propose(8, budget=_StrictBudget()).tokens)
    return proposals


def test_a_copy_that_drops_a_span_goes_on_after_it():
    """The output drops S[20:30] and copies on: once it has written 5 tokens of the source again, the copy
    resumes there, as sure as it was, instead of waiting for a 23-token match (config-edit dropped
    lines of its source and waited 10 rounds). Fails without resuming (every proposal empty)."""
    proposals = _leave_and_write(20, S[30:35])
    assert proposals[:4] == [()] * 4  # 1-4 tokens back on the source: not yet evidence
    assert proposals[4][:5] == tuple(S[35:40])


def test_only_a_long_copy_resumes_and_only_just_past_where_it_left():
    """A short match left (10 tokens) is no copy to resume; nor is the output writing source text from
    before the point it left (it went back, not on)."""
    assert _leave_and_write(10, S[20:30]) == [()] * 10
    assert _leave_and_write(20, S[2:12]) == [()] * 10


class _LongStepsBudget(_StrictBudget):
    """The same trust, on a model whose plain step takes 20 ms (Gemma 3 270M on a CPU core)."""

    step_seconds = 0.02


def _short_match_rounds(budget: _StrictBudget, **options) -> list[tuple[int, ...]]:
    """A prompt ending in S's first 3 tokens (a short match of S), then the output copies S on: the proposal
    made before each of 7 plain steps."""
    drafter = PromptLookupDrafter(**options)
    drafter.start(S + list(range(300, 310)) + S[:3])
    proposals = []
    for token in S[3:10]:
        proposals.append(drafter.propose(8, budget=budget).tokens)
        drafter.accept(0, [token])  # (declined: a plain step, which wrote the source's next token)
    return proposals


def test_where_steps_are_long_short_matches_are_searched_for_too():
    """A 3-token match can't be verified under a budget that trusts only the longest matches, but on a
    model whose plain step takes 2 ms or more a search is cheap beside the step: the match is proposed
    anyway (declined, it shows whether the output copies it) and followed round by round. Fails if only
    matches that could be verified were searched for there (nothing proposed before the match is 23
    tokens long); also if short matches were searched for on a small model's short steps or with
    ``short_matches_from=None`` (negative controls)."""
    proposals = _short_match_rounds(_LongStepsBudget())
    assert proposals[0] == tuple(S[3:11]) and proposals[-1] == tuple(S[9:17])
    assert _short_match_rounds(_StrictBudget()) == [()] * 7
    assert _short_match_rounds(_LongStepsBudget(), short_matches_from=None) == [()] * 7
    assert _short_match_rounds(_LongStepsBudget(), short_matches_from=0.05) == [()] * 7  # (20 ms < 50 ms)


@pytest.mark.parametrize("bad", [-1e-3, float("inf"), float("nan"), "2ms", True])
def test_short_matches_from_must_be_seconds(bad):
    with pytest.raises(ConfigError, match="short_matches_from"):
        PromptLookupDrafter(short_matches_from=bad)


class _LongishBudget(_StrictBudget):
    """Trusts matches of 5 tokens or more (bucket 4 on): those are searched for, shorter ones not."""

    min_confidence = 0.6

    def confidence(self, bucket: int, position: int = 0) -> float:
        return 0.9 if bucket // 4 >= 4 else 0.1


def test_a_short_match_in_between_does_not_stop_a_copy_resuming():
    """After leaving the copy the output writes 8 tokens found elsewhere (a short match of its own), leaves
    that too, then writes the source again just past where it left: the copy resumes with the
    confidence it had (its 20-token match), not as a new 5-token match. Fails when a short match found
    by a search forgets the copy left (the proposal then comes from a 5-token match)."""
    drafter = PromptLookupDrafter()
    drafter.start(S + list(range(300, 400)) + S[:20])
    assert drafter.propose(8).tokens == tuple(S[20:28])
    for token in list(range(350, 358)) + [999] + S[30:35]:
        drafter.accept(0, [token])
        proposal = drafter.propose(8, budget=_LongishBudget())
    assert proposal.tokens[:5] == tuple(S[35:40])
    assert proposal.buckets[0] // 4 >= 7  # a match of 15 or more: the copy's own


@pytest.mark.parametrize("base", [0, 1 << 21, (1 << 21) - 40])
def test_a_prompt_indexed_at_once_matches_as_one_indexed_token_by_token(base):
    """A long prompt's n-grams are keyed at numpy speed on its first search, later tokens one by one:
    both give the same proposals, also for ids too large to pack (ids >= 2^21 fall back)."""
    import random

    rng = random.Random(base)
    words = [base + rng.randrange(40) for _ in range(300)]
    context = words + words[50:60]
    for max_ngram in (2, 3, 5):
        at_once = PromptLookupDrafter(max_ngram=max_ngram)
        at_once.start(context)
        one_by_one = PromptLookupDrafter(max_ngram=max_ngram)
        one_by_one.start(context[:1])
        for token in context[1:]:
            one_by_one.propose(1)  # (indexes what came so far, a few tokens at a time)
            one_by_one.accept(0, [token])
        assert at_once.propose(8).tokens == one_by_one.propose(8).tokens == tuple(words[60:68])


@pytest.mark.parametrize("alphabet", [3, 50])
def test_edited_repeats_of_earlier_answers_are_copied_from_memory(alphabet):
    """Requests whose answers repeat an earlier one with a few spans replaced, dropped or put in (a
    short prompt, so the copy's source is the memory): drafting never fails, and on a varied vocabulary
    most of each repeat comes from accepted proposals. In a 3-token alphabet everything is ambiguous:
    there it must only not fail (the backward match stops at the short context's beginning)."""
    rng = random.Random(alphabet)
    copied = total = 0
    for _ in range(60):
        drafter = PromptLookupDrafter(memory_tokens=4096)
        previous = [rng.randrange(alphabet) for _ in range(rng.randint(20, 120))]
        for request in range(4):
            prompt = [rng.randrange(alphabet) for _ in range(rng.randint(1, 4))]
            out = list(previous)
            for _ in range(rng.randint(0, 4)):
                at, kind = rng.randrange(len(out)), rng.choice(["drop", "put in", "replace"])
                replaced = 0 if kind == "put in" else rng.randint(1, 3)
                out[at:at + replaced] = [rng.randrange(alphabet) for _ in range(0 if kind == "drop" else rng.randint(1, 3))]
            drafter.start(prompt)
            i = 0
            while i < len(out):  # greedy verification against the answer
                proposal = drafter.propose(8).tokens
                n = next((j for j, t in enumerate(proposal) if i + j >= len(out) or t != out[i + j]), len(proposal))
                drafter.accept(n, out[i:i + n + 1])
                i += n + 1
                if request:
                    copied, total = copied + n, total + n + 1
            previous = prompt + out
    if alphabet > 10:
        assert copied / total > 0.7


def test_a_proposal_longer_than_the_bucket_table_has_a_bucket_for_every_token():
    """An adaptive cap of 300 tokens and a copy that long: every drafted token gets a confidence bucket
    (past the table, the longest matches'). Fails with the table's slice alone: 300 tokens came with
    194 buckets, and DraftProposal raised ValueError (mid-generation, with an adaptive cap above 193)."""
    from specdec_gguf.schedule import AdaptiveSchedule

    source = [3 + (7 * i) % 500 for i in range(400)]
    drafter = PromptLookupDrafter()
    drafter.start(source + source[:40])
    schedule = AdaptiveSchedule(300, free_drafter=True, priors={g: drafter.acceptance_priors(g) for g in (True, False)})
    proposal = drafter.propose(300, budget=schedule.budget(True))
    assert list(proposal.tokens) == source[40:340]
    assert len(proposal.buckets) == 300 and proposal.buckets[-1] == proposal.buckets[-2]


def test_a_context_that_repeats_itself_is_copied_on_past_its_end():
    """Small models loop: where the match covers a whole period up to the context's end, the copy goes on
    into what it proposes, period after period (llama.cpp's ngram-cache drafts through loops the same way).
    A match shorter than the stretch it would copy to the end is no loop: its proposal stops at the end."""
    assert propose([1, 2, 3, 1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1]
    assert propose([5, 1, 2, 3, 1, 2, 3], 5) == [1, 2, 3, 1, 2]
    assert propose([7, 1, 2, 3, 9, 9, 9, 9, 1, 2, 3], 10) == [9, 9, 9, 9, 1, 2, 3]
    assert propose([1, 2, 3, 1, 2, 3], 7, follow_loops=False) == [1, 2, 3]


def test_a_loop_copied_past_its_end_goes_on_without_a_search():
    drafter = PromptLookupDrafter()
    drafter.start([4, 5, 6, 4, 5, 6])
    assert list(drafter.propose(5).tokens) == [4, 5, 6, 4, 5]
    drafter.accept(5, [4, 5, 6, 4, 5, 6])  # all accepted, and the target's own token goes on too
    assert list(drafter.propose(4).tokens) == [4, 5, 6, 4]
