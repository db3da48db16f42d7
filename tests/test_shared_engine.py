"""Generations that share an engine: paused streams, interleaved decoders, never silently wrong (issue 14).

A decoder compares the engine's own record of its cache with what it committed each time
a paused stream resumes; if another generation changed it, the decoder re-prefills its
context (and restarts its drafter on it) before the next round.
"""

from __future__ import annotations

import gc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_gguf import SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import InMemoryEngine


def reference(engine: InMemoryEngine, prompt: list[int], n: int) -> list[int]:
    ctx, out = list(prompt), []
    while len(out) < n and len(ctx) < engine.n_ctx:
        token = int(engine.logits_for(ctx).argmax())
        out.append(token)
        ctx.append(token)
    return out


def make_decoder(kind: str, target: InMemoryEngine, draft: InMemoryEngine) -> SpeculativeDecoder:
    drafter = {"plain": None, "lookup": PromptLookupDrafter(max_ngram=2),
               "model": AutoregressiveDrafter(draft)}[kind]
    return SpeculativeDecoder(target, drafter, num_draft_tokens=3)


def test_paused_stream_finishes_correctly_after_another_generation():
    """The reported case. Fails without the resume check: the paused stream continues from the other
    generation's cache and emits tokens the target would not."""
    target = InMemoryEngine.random(30, seed=1, n_ctx=200)
    decoder = make_decoder("plain", target, target)
    stream = decoder.stream([1, 2, 3], 40)
    first = list(next(stream).tokens)
    SpeculativeDecoder(target).generate([7, 8, 9, 10, 11], 30)
    rest = [t for event in stream for t in event.tokens]
    assert first + rest == reference(target, [1, 2, 3], 40)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), kinds=st.lists(st.sampled_from(["plain", "lookup", "model"]), min_size=1, max_size=3),
       seed=st.integers(0, 50))
def test_interleaved_streams_on_one_engine_match_their_references(data, kinds, seed):
    """Any interleaving of streams over one target (and one draft engine), from one decoder or several,
    some abandoned midway: each finished stream equals the target's own greedy output.
    Fails without the resume check (wrong tokens or a reset error). (An abandoned stream cutting the cache
    under a live one is caught by the engine state machine; here the resume check would repair it.)"""
    target = InMemoryEngine.random(24, seed=seed, n_ctx=120)
    draft = target.perturbed(0.4, seed=seed + 1)
    decoders = [make_decoder(kind, target, draft) for kind in kinds]
    streams = {}
    for i in range(data.draw(st.integers(2, 4))):
        decoder = data.draw(st.sampled_from(decoders))
        prompt = data.draw(st.lists(st.integers(0, 23), min_size=1, max_size=6))
        n = data.draw(st.integers(1, 25))
        streams[i] = (decoder.stream(prompt, n), prompt, n, [])
    while streams:
        i = data.draw(st.sampled_from(sorted(streams)))
        stream, prompt, n, got = streams[i]
        if data.draw(st.integers(0, 9)) == 0:  # abandon it: garbage-collected while paused
            del streams[i], stream
            gc.collect()
            continue
        event = next(stream)
        got.extend(event.tokens)
        if event.stop_reason is not None:
            assert got == reference(target, prompt, n)
            del streams[i]
