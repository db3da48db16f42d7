"""Numerical edge cases never give silent wrong output or a hang (issue 14).

Temperatures below GREEDY_BELOW sample as greedy; tiny temperatures above it don't overflow;
NaN/inf logits from a model become a clear EngineError on the greedy and the sampled path;
top-p on NaN probabilities terminates.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from specdec_gguf import EngineError, SamplingParams, SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import InMemoryEngine
from specdec_gguf.sampling import GREEDY_BELOW, probs_from_logits


@pytest.mark.parametrize("temperature", [1e-45, 1e-40, 5e-31])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_temperatures_below_the_threshold_are_greedy(target, draft, temperature, top_p):
    """Fails on the old sampler: logits * (1/T) overflowed to inf and NaN, so every step emitted the last
    vocabulary id (or, with top-p, looped forever on NaN probabilities)."""
    assert temperature < GREEDY_BELOW
    greedy = SpeculativeDecoder(target).generate([1, 2, 3], 30).tokens
    params = SamplingParams(temperature=temperature, top_p=top_p, seed=0)
    assert params.greedy
    for drafter in (None, PromptLookupDrafter(), AutoregressiveDrafter(draft)):
        assert SpeculativeDecoder(target, drafter, num_draft_tokens=3).generate([1, 2, 3], 30, params).tokens == greedy


@pytest.mark.parametrize("temperature", [GREEDY_BELOW, 1e-20, 1e-6])
def test_tiny_temperatures_above_the_threshold_stay_finite(temperature):
    """Just above the threshold the sampler still samples, and large logits don't overflow: the max is
    subtracted before scaling. Fails if logits were scaled first (1e9 / 1e-30 is inf in float32)."""
    logits = np.array([1e9, 1e9 - 64.0, -1e9, 3.0], dtype=np.float32)
    probs = probs_from_logits(logits, SamplingParams(temperature=temperature))
    assert np.isfinite(probs).all()
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]
    tie = probs_from_logits(np.array([5.0, 5.0, 1.0], dtype=np.float32), SamplingParams(temperature=temperature))
    assert tie.tolist() == [0.5, 0.5, 0.0]


def test_top_p_cut_terminates_on_nan():
    """Fails by hanging (killed after 60 s) when the threshold loop never ends on NaN probabilities."""
    code = ("import numpy as np; from specdec_gguf.sampling import _top_p_cut; "
            "print(len(_top_p_cut(np.full(8, np.nan, dtype=np.float32), 0.9)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_non_finite_logits_are_an_engine_error(bad, temperature):
    """An in-memory model whose logits hold NaN/inf for some contexts. Fails if greedy decoding takes numpy's
    argmax of a NaN row (the first NaN's id, silently) or sampling draws from NaN probabilities."""
    engine = InMemoryEngine.random(16, seed=2, n_ctx=64)
    engine._table_last[:, 5] = bad  # every row: token 5's logit is broken
    with pytest.raises(EngineError, match="non-finite logits"):
        SpeculativeDecoder(engine).generate([1, 2], 10, SamplingParams(temperature=temperature, seed=1))
    assert engine.n_past <= 1  # rolled back to the committed context


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_gguf_with_nan_weights_is_an_engine_error(tmp_path, temperature):
    """The same through llama.cpp: a tiny model with a NaN row in its output matrix."""
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.tiny import TinyShape, _random_weights, _write, tiny_vocab

    weights = _random_weights(1, len(tiny_vocab()[0]), TinyShape(), seed=4)
    weights["output.weight"][300] = np.nan
    path = _write(tmp_path / "nan.gguf", weights, 1, TinyShape(), "f32", "default", "nan")
    with LlamaCppEngine(path, n_ctx=64, n_batch=16) as engine:
        prompt = engine.tokenize("the model")
        with pytest.raises(EngineError, match=r"nan.gguf: the model produced non-finite logits|non-finite logits"):
            SpeculativeDecoder(engine).generate(prompt, 5, SamplingParams(temperature=temperature, seed=1))
        with pytest.raises(EngineError, match="non-finite logits"):
            engine.forward_last_argmax(prompt)


@pytest.mark.parametrize("spread", [0.5, 3.0, 30.0])
def test_a_drafted_tokens_probability_is_its_softmax(spread):
    """The draft's confidence (its bucket) is computed in float32 without normalizing the vector; it must
    still be the float64 softmax's value at the argmax, on a large vocabulary, from flat to peaked."""
    from specdec_gguf.drafters.autoregressive import _top_probability

    logits = (np.random.default_rng(0).standard_normal(262_144) * spread).astype(np.float32)
    before = logits.copy()
    top = int(np.argmax(logits))
    expected = 1.0 / np.exp(logits.astype(np.float64) - logits[top]).sum()
    assert _top_probability(logits, top) == pytest.approx(expected, rel=1e-4)
    assert np.array_equal(logits, before)  # (the row llama.cpp hands out is read, never written)
