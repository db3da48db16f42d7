"""PromptLookupDrafter on hand-made contexts."""

from __future__ import annotations

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


@pytest.mark.parametrize("kwargs", [{"min_ngram": 0}, {"max_ngram": 1, "min_ngram": 2},
                                    {"num_pred_tokens": 0}])
def test_bad_settings(kwargs):
    with pytest.raises(ConfigError):
        PromptLookupDrafter(**kwargs)
