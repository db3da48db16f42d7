"""Stop strings: split anywhere, multibyte characters, overlapping stop strings, the cache after a stop."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_gguf import SamplingParams, SpeculativeDecoder
from specdec_gguf.drafters import PromptLookupDrafter
from specdec_gguf.engines import InMemoryEngine
from specdec_gguf.errors import ConfigError
from specdec_gguf.stopping import StopStringMatcher, check_stop_strings
from specdec_gguf.textgen import stream_text

ALPHABET = "ab€😀\n"  # 1-, 3- and 4-byte UTF-8 characters


def reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Read the text one character at a time; stop at the first character that completes a stop string,
    cutting before the longest stop string ending there."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            longest = max(ending, key=len)
            return text[:end - len(longest)], longest
    return text, None


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@settings(max_examples=200, deadline=None)
@given(text=st.text(ALPHABET, max_size=30), stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1,
                                                           max_size=3),
       cuts=st.lists(st.integers(0, 30), max_size=10))
def test_matcher_equals_the_character_by_character_reference_for_any_split(text, stops, cuts):
    """Whatever the chunking, the released text is the reference cut and never includes part of a stop
    string; the hold-back is shorter than the longest stop string. Fails if the matcher takes the
    earliest *start* instead of the earliest *end*, or forgets text held from the previous chunk."""
    matcher = StopStringMatcher(stops)
    out, fed = "", 0
    for chunk in split(text, cuts):
        out += matcher.push(chunk)
        fed += len(chunk)
        if matcher.matched is None:
            assert fed - len(out) < max(map(len, stops))
    out += matcher.flush()
    expected, matched = reference(text, stops)
    assert out == expected
    assert matcher.matched == matched
    assert matcher.released == len(out)


def test_overlapping_stop_strings():
    """'bc' completes before 'abcd' could, so it wins even though 'abcd' starts earlier; of two ending
    at the same character the longer one cuts."""
    m = StopStringMatcher(["abcd", "bc"])
    assert m.push("xab") == "x" and m.push("cd") == "a" and m.matched == "bc"
    m = StopStringMatcher(["bc", "abc"])
    assert m.push("zabc") == "z" and m.matched == "abc"
    m = StopStringMatcher(["aab"])
    assert m.push("aa") == "" and m.push("a") == "a" and m.push("b") == "" and m.matched == "aab"


def test_stop_string_validation():
    assert check_stop_strings("END") == ("END",)
    assert check_stop_strings(None) == ()
    with pytest.raises(ConfigError, match="non-empty strings"):
        check_stop_strings(["ok", ""])
    with pytest.raises(ConfigError, match="non-empty strings"):
        check_stop_strings([3])
    with pytest.raises(ConfigError, match="at most"):
        check_stop_strings([str(i) for i in range(17)])


# -- through the decoder, with tokens whose bytes split UTF-8 characters ----------------------------

def _pieces(n_vocab: int) -> list[bytes]:
    """Token texts for an in-memory model: ASCII letters, whole multibyte characters and lone parts of them."""
    euro, smile = "€".encode(), "😀".encode()
    parts = [b"a", b"b", b" ", b"ab", euro, smile, euro[:1], euro[1:], smile[:2], smile[2:], b"\n"]
    return [parts[i % len(parts)] for i in range(n_vocab)]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), stops=st.lists(st.text("ab€😀 ", min_size=1, max_size=3), min_size=1, max_size=2),
       lookup=st.booleans())
def test_stream_text_cuts_at_the_stop_and_keeps_the_tokens_that_made_it(seed, stops, lookup):
    """The streamed text equals the reference cut of the full greedy text; the kept tokens are the shortest
    prefix whose text contains the stop string; the target's cache record is a prefix of prompt + output.
    Fails if tokens after the stop were kept, or if the matcher ran on raw bytes split mid-character."""
    engine = InMemoryEngine.random(40, seed=seed, n_ctx=256)
    pieces = _pieces(40)
    prompt = [1, 2, 3, 1, 2, 3]
    full = SpeculativeDecoder(engine).generate(prompt, 40).tokens
    full_text = b"".join(pieces[t] for t in full).decode("utf-8", errors="replace")
    expected, matched = reference(full_text, stops)

    drafter = PromptLookupDrafter() if lookup else None
    decoder = SpeculativeDecoder(engine, drafter, num_draft_tokens=4)
    events = list(stream_text(decoder, pieces.__getitem__, prompt, 40, SamplingParams(), stop=stops))
    text = "".join(e.text for e in events)
    tokens = [t for e in events for t in e.tokens]
    assert text == expected
    assert "".join(p for e in events for p, _ in e.pieces) == text
    assert tokens == full[:len(tokens)]
    if matched is not None:
        assert events[-1].stop_reason == "stop_string"
        decoded = lambda ts: b"".join(pieces[t] for t in ts).decode("utf-8", errors="replace")  # noqa: E731
        assert matched in decoded(tokens)[len(expected):]
        assert not reference(decoded(tokens[:-1]), stops)[1]
    context = prompt + full
    assert list(engine.tokens) == context[:engine.n_past]


def test_next_generation_after_a_stop_string_reuses_the_cache_correctly(tiny_engines):
    """A stop string ends generation mid-round on a real llama.cpp target; the next request on the same
    engine (prefix reuse from its cache record) still gives exactly the plain greedy output."""
    target, _ = tiny_engines
    target.reset(0)
    prompt = target.tokenize("the model is fast and the draft is the model is")
    plain = SpeculativeDecoder(target).generate(prompt, 48).tokens
    text = target.detokenize(plain)
    stop = text[len(text) // 2: len(text) // 2 + 3]
    decoder = SpeculativeDecoder(target, PromptLookupDrafter(), num_draft_tokens=8)
    events = list(stream_text(decoder, target.token_to_piece, prompt, 48, stop=[stop]))
    assert "".join(e.text for e in events) == text[:text.index(stop)]
    assert events[-1].stop_reason == "stop_string"
    assert list(target.tokens) == (prompt + plain)[:target.n_past]
    again = SpeculativeDecoder(target, PromptLookupDrafter(), num_draft_tokens=8).generate(prompt, 48).tokens
    assert again == plain
    follow_up = prompt + plain[:10] + target.tokenize(" and", add_bos=False)
    fresh = SpeculativeDecoder(target).generate(follow_up, 16).tokens
    target.reset(0)
    assert SpeculativeDecoder(target).generate(follow_up, 16).tokens == fresh


# -- run --stop and batch `stop` ------------------------------------------------------------------

def test_run_stop_flag_and_batch_stop_key(tiny_family, tmp_path):
    """`specdec run --stop` and a batch config's `stop` cut the text before the stop string and report
    stop_reason 'stop_string'; a bad stop value names the file and key."""
    import json

    from typer.testing import CliRunner

    from specdec_cli.app import app

    runner = CliRunner()
    base = ["run", "-m", str(tiny_family.target), "-p", "the model is", "-n", "24", "-c", "256", "--json"]
    plain = json.loads(runner.invoke(app, base).stdout)
    stop = plain["text"][8:11]
    cut = runner.invoke(app, [*base, "--stop", "zzz", "--stop", stop])
    assert cut.exit_code == 0, cut.output
    out = json.loads(cut.stdout)
    assert out["text"] == plain["text"][:plain["text"].index(stop)]
    assert out["stop_reason"] == "stop_string"
    assert out["tokens"] == plain["tokens"][:len(out["tokens"])] and len(out["tokens"]) < 24

    config = tmp_path / "b.toml"
    config.write_text(f'stop = [{json.dumps(stop)}]\nmax_tokens = 24\n[target]\nmodel = "{tiny_family.target}"\n'
                      f'n_ctx = 256\n[[prompts]]\nid = "a"\ntext = "the model is"\n')
    result = runner.invoke(app, ["batch", str(config), "-o", str(tmp_path / "out.jsonl")])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])
    assert record["text"] == out["text"] and record["stop_reason"] == "stop_string"

    config.write_text(f'stop = ["ok", 3]\n[target]\nmodel = "{tiny_family.target}"\n'
                      f'[[prompts]]\nid = "a"\ntext = "x"\n')
    bad = runner.invoke(app, ["batch", str(config)])
    assert bad.exit_code == 1 and "stop=" in bad.output and "b.toml" in bad.output
