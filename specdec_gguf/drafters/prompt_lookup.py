"""PromptLookupDrafter: model-free n-gram lookup over the context (and, optionally, earlier requests)."""

from __future__ import annotations

import bisect
from typing import Iterable, Sequence

import numpy as np

from ..engine import DrafterBase, common_prefix_length
from ..errors import ConfigError
from ..proposal import NO_PROPOSAL, DraftProposal, VerificationPolicy
from ..schedule import DraftBudget
from ..settings import MAX_NGRAM

MAX_MATCH = 64  # a match is measured back this far at most: longer ones are equally sure copies
CANDIDATES = 8  # latest occurrences of the tail n-gram compared per lookup (bounded work per round)
SEPARATOR = -1  # between remembered documents, so no match runs across two of them
MAX_SKIP = 4  # after failed searches, skip up to half this many rounds before searching again
MAX_EDIT = 8  # tokens: the longest span an edit learned from a copy may replace, or put in its place
MAX_EDITS = 16  # edits remembered per generation (the oldest is forgotten first)
MIN_EDIT_RUN = 8  # tokens of its source the output followed right before an edit: shorter runs are not copies
RESUME_RUN = 5  # tokens of its source the output writes again, past where it left it, for the copy to go on
RESUME_AHEAD = 64  # tokens: how far past where the output left its source it may come back (a dropped span)
MIN_RESUME_COPY = 16  # a copy is resumed only after it ran this long (a match of this many tokens)
# A plain step at least this long (seconds): matches too short to be verified are searched for too (a
# search for every length costs 5-50 us in CPython, at most 2.5% of such a step). Their proposals, declined,
# show round by round whether the output copies them, and a copy is followed from its first tokens.
SHORT_MATCHES_FROM = 2e-3

# Confidence buckets: a drafted token's effective match length m (the matched tail length plus
# the tokens before it in the proposal: if those are accepted the match grows by them), whether
# the previous round was fully accepted (a copy run), and whether the tail was followed by
# different tokens at different earlier occurrences (ambiguous).
_M_EDGES = (1, 2, 3, 4, 5, 7, 10, 15, 23)  # bucket i holds m >= _M_EDGES[i]
_M_BUCKET = [max(i for i, e in enumerate(_M_EDGES) if m >= e) for m in range(1, MAX_MATCH * 2 + 2)]
_M_PRIOR = (0.25, 0.35, 0.45, 0.55, 0.62, 0.7, 0.78, 0.85, 0.9)


# 4 x the match-length bucket of m = 1, 2, ... (past its end: the last, see _buckets).
_M_BASE = [4 * b for b in _M_BUCKET]


def _buckets(match: int, n: int, full: bool, ambiguous: bool) -> tuple[int, ...]:
    """Buckets of a proposal's n tokens continuing a match of length ``match``."""
    flags = 2 * full + ambiguous
    base = _M_BASE[match - 1:match - 1 + n]
    base += [_M_BASE[-1]] * (n - len(base))  # (past the table: the longest matches' bucket)
    return tuple(b + flags for b in base)


def _priors(scale: float) -> tuple[float, ...]:
    out = []
    for base in _M_PRIOR:
        for full in (0, 1):
            for ambiguous in (0, 1):
                out.append(min(0.97, max(0.05, (base + 0.05 * full - 0.1 * ambiguous) * scale)))
    return tuple(out)


def _matched_back(src: Sequence[int], end: int, tail: Sequence[int], start: int = 0) -> int:
    """How many tokens right before ``end`` in ``src`` equal the last ones of ``tail`` (the last
    ``start`` known to), at most ``MAX_MATCH`` and never past the beginning of either."""
    length, limit = start, min(MAX_MATCH, end, len(tail))
    while length < limit and src[end - 1 - length] == tail[-1 - length]:
        length += 1
    return length


_VECTOR_MIN = 32  # tokens to index at once from which numpy computes the keys
_ID_BITS = 21  # ids packed per key of a 2- or 3-gram (262k-token vocabularies: 18 bits)


def _gram_key(toks: Sequence[int], end: int, n: int, separated: bool = False) -> int | None:
    """The index key of the n-gram ``toks[end - n:end]`` (None: it spans a SEPARATOR)."""
    if n == 1:
        key = toks[end - 1]
        return None if key == SEPARATOR else key
    if separated and SEPARATOR in toks[end - n:end]:
        return None
    if n == 2:
        return (toks[end - 2] << _ID_BITS) ^ toks[end - 1]
    if n == 3:
        return (toks[end - 3] << 2 * _ID_BITS) ^ (toks[end - 2] << _ID_BITS) ^ toks[end - 1]
    return hash(tuple(toks[end - n:end]))


def _packed_keys(toks: list[int], first: int, stop: int, n: int) -> list[int | None]:
    """``_gram_key`` of the n-grams (n = 2, 3) ending at ``first`` .. ``stop - 1``, computed at once."""
    ids = np.asarray(toks[first - n:stop - 1], dtype=np.int64)
    if ids.min() < 0 or ids.max() >= 1 << _ID_BITS:  # (packed into int64 they would not be the same keys)
        return [_gram_key(toks, end, n) for end in range(first, stop)]
    keys = (ids[:-1] << _ID_BITS) ^ ids[1:] if n == 2 else \
        (ids[:-2] << 2 * _ID_BITS) ^ (ids[1:-1] << _ID_BITS) ^ ids[2:]
    return keys.tolist()


class _Index:
    """Where each n-gram (n in [min_n, max_n]) of a token list ended: per n, key -> positions, ascending.

    Keys are the token itself (n = 1), the ids packed into one integer (n = 2, 3: exact for ids
    below 2^21) or a hash of the n-gram, so memory grows with the number of tokens times the
    number of n, not with n squared; a (rare) collision is caught when the match is checked
    token by token. ``separated`` lists may hold SEPARATOR between documents.
    """

    def __init__(self, min_n: int, max_n: int, separated: bool = False) -> None:
        self.min_n, self.max_n, self.separated = min_n, max_n, separated
        self.tokens: list[int] = []
        self.positions: list[dict[int, int | list[int]]] = [{} for _ in range(max_n + 1)]
        self._indexed = [0] * (max_n + 1)  # per n: n-grams continuing before this position are indexed

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens. Each n-gram length is indexed when a search first needs it: on open text only
        the longest are searched for, and a round's work stays near a plain round's."""
        self.tokens.extend(map(int, tokens))

    def index(self, n: int) -> None:
        """Index the n-grams of length ``n`` now rather than at the first search that needs them."""
        self._catch_up(n)

    def _catch_up(self, n: int) -> dict[int, int | list[int]]:
        """The table of n-grams, brought up to date: n-gram ``tokens[end - n:end]`` -> its ``end``s."""
        toks, table = self.tokens, self.positions[n]
        first, stop = max(self._indexed[n], n), len(toks)
        keys: Iterable[int | None]
        if 1 < n <= 3 and stop - first >= _VECTOR_MIN and not self.separated:
            keys = _packed_keys(toks, first, stop, n)  # a prompt's first search: its keys at numpy speed
        else:
            keys = (_gram_key(toks, end, n, self.separated) for end in range(first, stop))
        for end, key in enumerate(keys, start=first):
            if key is None:
                continue  # (a gram across documents)
            found = table.get(key)
            if found is None:
                table[key] = end  # most n-grams occur once: a bare int until they repeat
            elif type(found) is int:
                table[key] = [found, end]
            else:
                found.append(end)
        self._indexed[n] = len(toks)
        return table

    def ends(self, tail: Sequence[int], n: int) -> Sequence[int]:
        """Where the n-gram ``tail[-n:]`` ended earlier (ascending; a collision may slip in)."""
        found = self._catch_up(n).get(_gram_key(tail, len(tail), n))
        return () if found is None else (found,) if type(found) is int else found

    def best_match(self, tail: list[int], shortest: int = 1) -> tuple[int, int, bool]:
        """(continuation start, match length, ambiguous) of the longest earlier match of ``tail``'s end.

        Tries the longest indexed n-gram first (down to ``shortest``) and compares the latest few
        occurrences, extending each match backwards; (-1, 0, False) when nothing matches.
        """
        toks, size = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, len(tail)), max(self.min_n, shortest) - 1, -1):
            found = self.ends(tail, n)
            best, best_len, first_next, ambiguous = -1, 0, None, False
            for pos in reversed(found[-CANDIDATES:]):
                if pos >= size or toks[pos] == SEPARATOR:
                    continue
                length = _matched_back(toks, pos, tail)
                if length < n:
                    continue  # a hash collision
                if first_next is None:
                    first_next = toks[pos]
                elif toks[pos] != first_next:
                    ambiguous = True
                if length > best_len:
                    best, best_len = pos, length
            if best >= 0:
                return best, best_len, ambiguous
        return -1, 0, False


class PromptLookupDrafter(DrafterBase):
    """Propose what followed the longest earlier match of the context's tail.

    The tail's last ``max_ngram`` .. ``min_ngram`` tokens are looked up in an index of where
    each n-gram occurred; the latest occurrences are compared backwards to find the longest
    match (up to 64 tokens), whose continuation is proposed. While accepted tokens keep
    following the same source, the next round continues from it without a search.
    ``num_pred_tokens`` caps a proposal (None: the decoder's k decides). The proposal is
    deterministic, so q is one-hot.

    Copies with edits learn the edits: where the output copied its source, wrote a few tokens
    differently (a renamed variable, a replaced word) and went on copying, the source span and
    what the output wrote instead are remembered. A proposal stops before the next such span
    (the target's own token there shows whether the edit is made again, at no cost); once it
    was, proposals draft the replacement (every later ``users`` of a rename to ``records``, each
    ``council`` of a rewrite). An edit the output does not make is forgotten, and the copy
    goes on from the source. Where the output leaves a long copy and, within 64 tokens, writes
    5 tokens of its source again just past where it left (a span dropped, replaced or put in:
    a config with lines removed), the copy resumes there as sure as it was, instead of waiting
    for a new match long enough to trust.

    Small models loop: where the context repeats itself (the match covers a whole period, up to the
    context's end), the copy goes on into what it proposes, period after period, as llama.cpp's
    ngram-cache drafts through loops (``follow_loops=False``: a proposal stops at the context's end).

    Only matches long enough that their first token could be verified are searched for, unless the
    target's plain step takes ``short_matches_from`` seconds or more (2 ms; None: never): then a search,
    cheap beside the step, looks for every match, and a copy is followed from its first tokens.

    ``memory_tokens`` > 0 also remembers earlier generations' contexts (prompt and output,
    the most recent ``memory_tokens`` tokens of them) and drafts from them when they match
    longer, as SuffixDecoding does: repeated edits and agent loops quote what was seen before.
    """

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_pred_tokens: int | None = None,
                 memory_tokens: int = 0, follow_loops: bool = True,
                 short_matches_from: float | None = SHORT_MATCHES_FROM) -> None:
        if not isinstance(min_ngram, int) or not 1 <= min_ngram <= MAX_NGRAM:
            raise ConfigError(f"min_ngram={min_ngram!r} must be an integer in [1, {MAX_NGRAM}]")
        if not isinstance(max_ngram, int) or not min_ngram <= max_ngram <= MAX_NGRAM:
            raise ConfigError(f"max_ngram={max_ngram!r} must be an integer in [min_ngram={min_ngram}, {MAX_NGRAM}]")
        if num_pred_tokens is not None and (not isinstance(num_pred_tokens, int) or num_pred_tokens < 1):
            raise ConfigError(f"num_pred_tokens={num_pred_tokens!r} must be an integer >= 1 or None")
        if not isinstance(memory_tokens, int) or memory_tokens < 0:
            raise ConfigError(f"memory_tokens={memory_tokens!r} must be an integer >= 0")
        if short_matches_from is not None and not (isinstance(short_matches_from, (int, float))
                                                   and not isinstance(short_matches_from, bool)
                                                   and 0.0 <= short_matches_from < float("inf")):
            raise ConfigError(f"short_matches_from={short_matches_from!r} must be seconds >= 0 (finite) or None")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.num_pred_tokens = num_pred_tokens
        self.memory_tokens = memory_tokens
        self.follow_loops = follow_loops
        self.short_matches_from = short_matches_from
        self._ctx = _Index(min_ngram, max_ngram)
        self._memory = _Index(min_ngram, max_ngram, separated=True)
        self._docs: list[list[int]] = []  # remembered contexts, oldest first
        self._src: tuple[_Index, int] | None = None  # (where, position) the last proposal continued from
        self._pending: tuple[int, ...] = ()  # the rest of an edit's replacement, proposed before the source
        self._edits: dict[tuple[int, ...], tuple[int, ...]] = {}  # source span -> what the output wrote
        self._edit_starts: dict[int, list[tuple[int, ...]]] = {}  # first token -> spans starting with it
        self._confirmed: set[tuple[int, ...]] = set()  # spans whose edit the output made again: drafted
        self._refuted: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()  # edits the output did not make
        self._prompt_length = 0
        self._match = 0
        self._ambiguous = False
        self._full = False  # the last round's committed tokens all followed the source (a copy run)
        self._shortest, self._shortest_age, self._shortest_full = min_ngram, 8, False
        self._misses = self._skip_searches = 0
        self._asked = False  # whether this round's propose was called (a pause's rounds are not asked)
        # Where the output last left a copy: (source, position, context length then, match length then).
        self._lost: tuple[_Index, int, int, int] | None = None

    @property
    def context(self) -> tuple[int, ...]:
        return tuple(self._ctx.tokens)

    def acceptance_priors(self, greedy: bool) -> tuple[float, ...]:
        return _priors(1.0 if greedy else 0.85)

    def start(self, prompt_tokens: Sequence[int]) -> None:
        if self.memory_tokens and len(self._ctx.tokens) > 1:
            self._remember(self._ctx.tokens)
        self._ctx = _Index(self.min_ngram, self.max_ngram)
        self._ctx.extend(prompt_tokens)
        self._ctx.index(self.max_ngram)  # the first search looks for these: index the prompt with its prefill
        self._src, self._pending, self._match, self._full = None, (), 0, False
        self._edits, self._edit_starts, self._confirmed, self._refuted = {}, {}, set(), set()  # per generation
        self._prompt_length = len(prompt_tokens)  # edits are learned from the output only
        self._misses = self._skip_searches = 0
        self._lost = None

    def propose(self, max_tokens: int, policy: VerificationPolicy | None = None,
                rng: np.random.Generator | None = None, budget: DraftBudget | None = None) -> DraftProposal:
        self._asked = True
        if self.num_pred_tokens is not None:
            max_tokens = min(max_tokens, self.num_pred_tokens)
        if max_tokens <= 0 or not self._find(self._shortest_useful(budget)):
            return NO_PROPOSAL
        where, start = self._src  # type: ignore[misc]
        spans: list[tuple[int, ...] | None] = []
        if self._edits:
            tokens, _, spans = self._continuation(where, start, self._pending, max_tokens, hedge=True)
        else:
            tokens = where.tokens[start:start + max_tokens]
            if where.separated and SEPARATOR in tokens:
                tokens = tokens[:tokens.index(SEPARATOR)]
            elif self.follow_loops and where is self._ctx and len(tokens) < max_tokens \
                    and start + len(tokens) == len(where.tokens) and self._match >= len(tokens):
                # The context repeats itself (the match covers a whole period, up to its end): the copy
                # goes on into what it proposes, period after period. (The memory is no loop of this
                # context: its documents end with a SEPARATOR, so its proposals never reach its end.)
                tokens = (tokens * (max_tokens // len(tokens) + 1))[:max_tokens]
        if not tokens:
            return NO_PROPOSAL
        buckets = _buckets(self._match, len(tokens), self._full, self._ambiguous) if budget is not None else None
        if buckets is not None and any(spans):
            # The source said otherwise where an edit is made: such tokens are as unsure as an ambiguous match.
            buckets = tuple(b if span is None else b | 1 for b, span in zip(buckets, spans))
        return DraftProposal(tokens=tuple(tokens), buckets=buckets)

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self._ctx.extend(committed)
        if not self._asked:
            self._skip_searches = 0  # rounds it was not asked for (a pause) spaced its searches already
        self._asked = False
        # Keep following the same source while what was committed agrees with it (a copy run).
        self._full = False
        if self._src is None:
            return
        where, start = self._src
        committed = list(committed)
        if not self._edits:
            stop = start + len(committed)
            if stop < len(where.tokens) and where.tokens[start:stop] == committed and where.tokens[stop] != SEPARATOR:
                self._src, self._full = (where, stop), True
                self._match = min(self._match + len(committed), MAX_MATCH)
                return
            agree = common_prefix_length(committed, where.tokens[start:stop])  # (a rejection: not every round)
            self._leave(where, start + agree, len(committed) - agree)
            return
        while True:
            stream, states, spans = self._continuation(where, start, self._pending, len(committed) + 1)
            agree = next((i for i, (a, b) in enumerate(zip(committed, stream)) if a != b),
                         min(len(committed), len(stream)))
            for i in range(agree):
                if spans[i] is not None and not states[i][1]:
                    self._confirmed.add(spans[i])  # the output made the edit again: propose it from now on
            if agree == len(committed) and len(stream) > agree:  # (the source goes on past what was committed)
                position, pending = states[agree - 1] if agree else (start, self._pending)
                self._src, self._pending, self._full = (where, position), pending, True
                self._match = min(self._match + len(committed), MAX_MATCH)
                return
            if agree < len(committed) and agree < len(stream) and spans[agree] is not None:
                # Where an edit would go the output wrote something else: the edit was wrong here. If it
                # wrote what the source says, the copy goes on without the edit.
                first = not (states[agree - 1][1] if agree else self._pending)
                self._forget_edit_span(spans[agree], refuted=True)
                if first:
                    continue
            self._leave(where, states[agree - 1][0] if agree else start, len(committed) - agree)
            return

    def _leave(self, where: _Index, position: int, written: int) -> None:
        """The output stopped following ``where`` at ``position`` and has written ``written`` tokens since."""
        if self._match >= MIN_RESUME_COPY and where is self._ctx:
            self._lost = (where, position, len(self._ctx.tokens) - written, self._match)
        # (Leaving a short match keeps the long copy left before it, which may still resume.)
        self._src, self._pending = None, ()

    def _resume(self) -> bool:
        """Whether the output, soon after it left a long copy, writes its source again a little past where
        it left (a span replaced, dropped or put in: an edit): then the copy goes on from there as sure
        as it was, without waiting for a new match long enough to trust (10-23 tokens: most of the
        rounds an edit cost). Given up once the output has written ``RESUME_AHEAD`` tokens since."""
        where, position, left_at, match = self._lost  # type: ignore[misc]
        ctx, src = self._ctx.tokens, where.tokens
        if len(ctx) - left_at > RESUME_AHEAD:
            self._lost = None
            return False
        n = min(3, where.max_n)  # the tail is looked up by its last 3 tokens, then measured back
        if len(ctx) - left_at < RESUME_RUN:
            return False
        tail = ctx[-n:]
        found = where.ends(tail, n)  # ascending: only the window past where the output left is scanned
        window = found[bisect.bisect_left(found, position + RESUME_RUN):
                       bisect.bisect_right(found, min(position + RESUME_AHEAD, left_at - 1))]
        for end in window:
            if src[end - n:end] == tail:
                length = _matched_back(src, end, ctx, n)  # (at most the context: it may be short)
                if length < RESUME_RUN:
                    continue
                self._learn_edit(where, end, length)
                self._lost = None
                self._src, self._pending, self._match, self._ambiguous = (where, end), (), match, False
                return True
        return False

    def _shortest_useful(self, budget: DraftBudget | None) -> int:
        """The shortest match to search for: where a plain step takes ``short_matches_from`` seconds or
        more, every match; else the shortest whose first token could be verified.

        On open text most lookups find only short matches that never pay on a CPU; on a small model
        skipping them keeps a round's cost near a plain round's. On a larger one a search is cheap
        beside a step, and a short match's declined proposals show whether the output goes on copying
        it: a copy that starts with the answer is followed from its first tokens, not from when its
        match grew long enough to trust (20-odd rounds: a third of a 64-token answer). Recomputed every
        few rounds (the calibration and the costs move slowly).
        """
        if budget is None:
            return self.min_ngram
        self._shortest_age += 1
        if self._shortest_age >= 8 or self._shortest_full != self._full:
            self._shortest_age, self._shortest_full = 0, self._full
            step = budget.step_seconds
            if self.short_matches_from is not None and step is not None and step >= self.short_matches_from:
                self._shortest = self.min_ngram  # (searching costs little beside such a step: see SHORT_MATCHES_FROM)
                return self._shortest
            needed, flags = budget.min_confidence, 2 * self._full
            # The longest matches are always looked for: if none may be verified yet, their
            # proposals still show (declined) whether they were right, which is how the
            # calibration learns that a long copy pays on a steep curve.
            self._shortest = max(_M_EDGES[-1], self.min_ngram)
            for i, edge in enumerate(_M_EDGES):
                if budget.confidence(4 * i + flags) >= needed:
                    self._shortest = max(edge, self.min_ngram)
                    break
        return self._shortest

    def _find(self, shortest: int) -> bool:
        """Set the source to continue from: the sticky one, else the longest match in context or memory."""
        # A short match followed since the output left a long copy does not stop that copy resuming.
        if self._lost is not None and (self._src is None or self._match < MIN_RESUME_COPY) and self._resume():
            return True
        if self._src is not None:
            return True
        if shortest > MAX_MATCH:
            return False
        if self._skip_searches > 0:  # recent searches found nothing: look again in a few rounds
            self._skip_searches -= 1
            return False
        tail = self._ctx.tokens[-MAX_MATCH:]
        pos, length, ambiguous = self._ctx.best_match(tail, min(shortest, self.max_ngram))
        where = self._ctx
        if self._docs:
            mem_pos, mem_len, mem_ambiguous = self._memory.best_match(tail, min(shortest, self.max_ngram))
            if mem_len > length:
                where, pos, length, ambiguous = self._memory, mem_pos, mem_len, mem_ambiguous
        if pos < 0 or length < max(self.min_ngram, shortest):
            # Back off on open text (searches cost more than a tiny model's round); a copy that
            # starts meanwhile is found at most MAX_SKIP rounds late and then followed for free.
            self._misses = min(self._misses + 1, MAX_SKIP)
            self._skip_searches = self._misses // 2
            return False
        self._misses = 0
        if length >= MIN_RESUME_COPY:
            self._lost = None  # a long copy of its own: the one left is not coming back
        self._learn_edit(where, pos, length)
        self._src, self._pending, self._match, self._ambiguous = (where, pos), (), length, ambiguous
        return True

    # -- edits -------------------------------------------------------------------------------------
    def _continuation(self, where: _Index, position: int, pending: tuple[int, ...], limit: int,
                      hedge: bool = False) -> tuple[list[int], list[tuple[int, tuple[int, ...]]],
                                                    list[tuple[int, ...] | None]]:
        """Up to ``limit`` tokens that follow a source with the learned edits made; after each, the
        (source position, rest of a replacement) to continue from, and the source span of the edit
        that put it there (None: the source's own token). ``hedge`` stops before an edit that was
        not yet seen made twice: then the target's own token there tells, at no cost."""
        toks = where.tokens
        tokens: list[int] = []
        states: list[tuple[int, tuple[int, ...]]] = []
        spans: list[tuple[int, ...] | None] = []
        span: tuple[int, ...] | None = None
        while len(tokens) < limit:
            if not pending:
                if position >= len(toks) or toks[position] == SEPARATOR:
                    break
                span = self._edit_at(toks, position)
                if span is None:
                    tokens.append(toks[position])
                    position += 1
                    states.append((position, ()))
                    spans.append(None)
                    continue
                if hedge and span not in self._confirmed:
                    break
                position += len(span)
                pending = self._edits[span]  # (never empty: deletions are not learned)
            tokens.append(pending[0])
            pending = pending[1:]
            states.append((position, pending))
            spans.append(span)
        return tokens, states, spans

    def _edit_at(self, toks: list[int], position: int) -> tuple[int, ...] | None:
        """The learned edit's source span that starts at ``toks[position]``, if any."""
        for span in self._edit_starts.get(toks[position], ()):
            if tuple(toks[position:position + len(span)]) == span:
                return span
        return None

    def _learn_edit(self, where: _Index, position: int, length: int) -> None:
        """A match of ``length`` tokens ending at ``position``: if the output had followed the same source
        right before it (``MIN_EDIT_RUN`` tokens) but for a span written differently, that span and what
        the output wrote instead are an edit to make again.

        Neither an insertion (nothing to recognise it by) nor a deletion (a span dropped once, often a
        common token, is rarely dropped everywhere: proposing it dropped cost a rejection each time).
        """
        src, ctx, run = where.tokens, self._ctx.tokens, MIN_EDIT_RUN
        old_end, new_end = position - length, len(ctx) - length  # where the match began
        if length >= min(MAX_MATCH, len(ctx)) or old_end <= run or new_end <= self._prompt_length:
            return  # the match did not begin at a difference, or not in the output
        # The token before each candidate replacement (1..MAX_EDIT tokens long): the run ends with it.
        ends = {ctx[new_end - n - 1]: n for n in range(min(MAX_EDIT, new_end - self._prompt_length), 0, -1)
                if new_end - n > run}
        for old_len in range(1, min(MAX_EDIT, old_end - run) + 1):
            before = old_end - old_len  # the run before the edit ends here in the source
            new_len = ends.get(src[before - 1])
            if new_len is None or src[before - run:before] != ctx[new_end - new_len - run:new_end - new_len]:
                continue
            old, new = tuple(src[before:old_end]), tuple(ctx[new_end - new_len:new_end])
            if old[0] == new[0] or SEPARATOR in old or (old, new) in self._refuted or self._edits.get(old) == new:
                return  # (one that begins alike is an insertion or a deletion after all)
            self._forget_edit_span(old)  # (another replacement of the same span)
            if len(self._edits) >= MAX_EDITS:
                self._forget_edit_span(next(iter(self._edits)))  # the oldest
            self._edits[old] = new
            self._edit_starts.setdefault(old[0], []).append(old)
            return

    def _forget_edit_span(self, span: tuple[int, ...], refuted: bool = False) -> None:
        new = self._edits.pop(span, None)
        if new is not None:
            self._edit_starts[span[0]].remove(span)
            self._confirmed.discard(span)
            if refuted:  # (not learned again from where it was first seen)
                self._refuted.add((span, new))

    def _remember(self, tokens: Sequence[int]) -> None:
        """Add one finished context to the memory, dropping the oldest beyond ``memory_tokens``."""
        doc = list(tokens[-self.memory_tokens:])
        self._docs.append(doc)
        total = sum(len(d) for d in self._docs)
        if total <= self.memory_tokens:
            self._memory.extend(doc + [SEPARATOR])
            return
        while self._docs and total > self.memory_tokens:  # evict, then rebuild (amortised: rare)
            total -= len(self._docs.pop(0))
        self._memory = _Index(self.min_ngram, self.max_ngram, separated=True)
        for d in self._docs:
            self._memory.extend(d + [SEPARATOR])
