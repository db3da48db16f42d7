"""flash_attn="auto" on the CPU: both settings timed once, the faster one used, the choice cached."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.profile import CostProfile
from specdec_gguf.engines.llama_cpp import attention

CONTEXT = list(range(5, 305))  # long enough that the two settings' logits differ in their last bits


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """An empty user cache for this test alone (the choice is cached per model file)."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    return tmp_path


def _open(tiny_family, **kw) -> LlamaCppEngine:
    return LlamaCppEngine(tiny_family.target, n_ctx=512, n_batch=64, n_threads=1, **kw)


def _last_logits(engine: LlamaCppEngine) -> np.ndarray:
    engine.reset(0)
    engine.advance(CONTEXT[:-3])
    return engine.forward_logits(CONTEXT[-3:]).copy()


def _logits_with(tiny_family, flash_attn: str) -> np.ndarray:
    engine = _open(tiny_family, flash_attn=flash_attn)
    try:
        return _last_logits(engine)
    finally:
        engine.close()


def test_auto_times_both_settings_and_runs_with_the_faster(tiny_family, own_cache):
    engine = _open(tiny_family)
    try:
        choice = engine.attention
        assert choice is not None and not choice.from_cache
        assert set(choice.seconds) == {"on", "off"}
        assert all(set(by_n) == set(attention.PROBE_SIZES) and min(by_n.values()) > 0 for by_n in choice.seconds.values())
        on, off = (sum(choice.seconds[name].values()) for name in ("on", "off"))
        assert choice.flash_attn == (off >= attention.OFF_MARGIN * on)  # (off only where clearly faster)
        auto = _last_logits(engine)
    finally:
        engine.close()
    chosen, other = ("on", "off") if choice.flash_attn else ("off", "on")
    # The engine's context runs with the chosen setting: bit for bit its logits, not the other's.
    np.testing.assert_array_equal(auto, _logits_with(tiny_family, chosen))
    assert not np.array_equal(auto, _logits_with(tiny_family, other))


def test_a_cached_choice_is_used_without_timing_and_keys_the_cost_profile(tiny_family, own_cache, monkeypatch):
    first = _open(tiny_family)
    timed, key = first.attention, first.profile_key
    first.close()
    (path,) = own_cache.glob("profiles/attention-*.json")

    def no_timing(*args, **kwargs):
        raise AssertionError("timed again although the choice was cached")

    monkeypatch.setattr(attention, "_time_both", no_timing)
    again = _open(tiny_family)
    assert again.attention.from_cache and again.attention.flash_attn == timed.flash_attn
    assert again.profile_key == key
    again.close()

    # The cache decides: flipped there, the next engine runs with the other setting, and its cost profile
    # (timed with one setting) is not the one cached for the other.
    data = json.loads(path.read_text())
    data["flash_attn"] = not timed.flash_attn
    path.write_text(json.dumps(data))
    flipped = _open(tiny_family)
    try:
        assert flipped.attention.flash_attn is not timed.flash_attn
        assert flipped.profile_key != key
        logits = _last_logits(flipped)
    finally:
        flipped.close()
    np.testing.assert_array_equal(logits, _logits_with(tiny_family, "on" if not timed.flash_attn else "off"))


def test_nothing_is_timed_when_the_setting_is_given_or_exact_or_the_context_short(tiny_family, own_cache,
                                                                                monkeypatch):
    """Fails if an engine with a short context timed (or cached) a choice the engines with long ones would read."""
    def no_timing(*args, **kwargs):
        raise AssertionError("timed although nothing was left to choose")

    monkeypatch.setattr(attention, "_time_both", no_timing)
    for kw in ({"flash_attn": "on"}, {"flash_attn": "off"}, {"exact": "warn"}):
        engine = _open(tiny_family, **kw)
        assert engine.attention is None, kw
        engine.close()
    short = LlamaCppEngine(tiny_family.target, n_ctx=attention.PROBE_CONTEXT, n_batch=64, n_threads=1)
    assert short.attention.flash_attn is None and "shorter than" in short.attention.summary()
    short.close()
    assert not list(own_cache.glob("profiles/attention-*.json"))


def test_wide_heads_keep_llama_cpps_choice_untimed(tmp_path, own_cache, monkeypatch):
    """Heads of WIDE_HEADS or more (Gemma 3's 256) are not timed: llama.cpp's kernel keeps up there. Fails if such a
    model were timed, or a narrower one were not."""
    from specdec_gguf.tiny import TinyShape, write_tiny_model

    def no_timing(*args, **kwargs):
        raise AssertionError("timed a model with wide heads")

    wide = write_tiny_model(tmp_path / "wide.gguf", n_layers=1, shape=TinyShape(n_embd=512, n_head=2))  # heads of 256
    monkeypatch.setattr(attention, "_time_both", no_timing)
    with LlamaCppEngine(wide, n_ctx=512, n_batch=64, n_threads=1) as engine:
        assert attention.head_size(engine._model) == attention.WIDE_HEADS
        assert engine.attention.flash_attn is None and "heads 256 wide" in engine.attention.summary()
    assert not list(own_cache.glob("profiles/attention-*.json"))
    narrow = write_tiny_model(tmp_path / "narrow.gguf", n_layers=1, shape=TinyShape(n_embd=256, n_head=2))  # 128
    with pytest.raises(AssertionError, match="timed a model"):
        LlamaCppEngine(narrow, n_ctx=512, n_batch=64, n_threads=1)


def test_a_model_too_slow_to_time_keeps_llama_cpps_choice(tiny_family, own_cache, monkeypatch):
    """Far over the budget, the choice (llama.cpp's) is remembered; near it, the next load tries again (a busy
    moment must not turn the timing off for good). Fails if a near miss were cached or a sure one were not."""
    monkeypatch.setattr(attention, "PROBE_BUDGET", 1e-9)  # every model is far "too slow" for it
    engine = _open(tiny_family)
    try:
        assert engine.attention.flash_attn is None and not engine.attention.seconds
        assert "not timed" in engine.attention.summary()
        logits = _last_logits(engine)
    finally:
        engine.close()
    np.testing.assert_array_equal(logits, _logits_with(tiny_family, "on"))  # (llama.cpp's "auto" on a CPU: on)
    (cached,) = own_cache.glob("profiles/attention-*.json")
    assert json.loads(cached.read_text())["flash_attn"] is None
    cached.unlink()

    near = {}

    def take_in(self, token, limit):  # the pace read just over the limit, as in a busy moment
        near["limit"] = limit
        return 1.2

    monkeypatch.setattr(attention, "PROBE_BUDGET", 1.5)
    monkeypatch.setattr(attention._Probe, "take_in", take_in)
    engine = _open(tiny_family)
    assert engine.attention.flash_attn is None and near["limit"] == 0.75
    engine.close()
    assert not list(own_cache.glob("profiles/attention-*.json"))


def test_a_child_process_engine_reports_its_childs_choice(tiny_family, own_cache):
    """A ProcessEngine's ``attention`` is what flash_attn="auto" chose in its child (the same cache and key as
    this process: the same choice), and a given setting leaves it None there too."""
    import sys

    from specdec_gguf.attention import AttentionChoice
    from specdec_gguf.engines import ProcessEngine

    here = _open(tiny_family)
    choice = here.attention
    here.close()
    child = ProcessEngine(tiny_family.target, python=sys.executable, n_ctx=512, n_batch=64, n_threads=1)
    try:
        assert isinstance(child.attention, AttentionChoice) and child.attention.from_cache
        assert child.attention.flash_attn == choice.flash_attn and child.attention.seconds == choice.seconds
    finally:
        child.close()
    given = ProcessEngine(tiny_family.target, python=sys.executable, n_ctx=512, n_batch=64, n_threads=1,
                          flash_attn="off")
    assert given.attention is None
    given.close()


def test_a_profile_is_priced_past_its_short_context_from_the_timing_that_turned_flash_attention_off():
    """A profile too slow to time after a long context takes its costs as the same at any context; without flash
    attention they grow past 256 tokens, where the timing ran: runs take its passes as the long context. With it
    on, or a long-context timing of the profile's own, nothing changes."""
    from specdec_gguf.attention import AttentionChoice
    from specdec_gguf.profile import with_timed_context

    profile = CostProfile({1: 0.010, 2: 0.013, 5: 0.025, 9: 0.040})  # (no long-context timing: a slow model)
    off = AttentionChoice(flash_attn=False, context=256, seconds={"off": {1: 0.020, 5: 0.030}, "on": {1: 0.03, 5: 0.05}})
    priced = with_timed_context(profile, off)
    assert (priced.long_context, priced.long_seconds) == (256, {1: 0.020, 5: 0.030})
    assert priced.seconds == profile.seconds and priced.measured_at == profile.measured_at
    # After 256 tokens a one-token pass costs what the timing found, not the short curve's price.
    assert priced.at_context(256).cost(1) == pytest.approx(0.020) and priced.at_context(136).cost(1) == pytest.approx(0.015)
    assert profile.at_context(256).cost(1) == pytest.approx(0.010)
    for choice in (AttentionChoice(flash_attn=True, context=256, seconds=off.seconds),  # on: its growth starts at once
                   AttentionChoice(flash_attn=None, reason="too slow"),
                   AttentionChoice(flash_attn=False, context=256, seconds={"off": {1: 0.020, 3: 0.03}}),  # 3 not profiled
                   None):
        assert with_timed_context(profile, choice) is profile, choice
    own = CostProfile(profile.seconds, long_context=128, long_seconds={1: 0.011, 9: 0.044})  # a fast model's
    assert with_timed_context(own, off) is own


def test_profile_for_prices_with_the_timing_and_caches_the_profile_as_measured(tiny_family, own_cache):
    from specdec_gguf.profile import load_cached, profile_for, save

    _open(tiny_family).close()  # (times the choice and caches it)
    (path,) = own_cache.glob("profiles/attention-*.json")
    data = json.loads(path.read_text())
    data.update(flash_attn=False, seconds={"on": {"1": 0.005, "5": 0.009}, "off": {"1": 0.003, "5": 0.004}})
    path.write_text(json.dumps(data))  # (set here, so the test reads them back, whatever this machine timed)
    engine = _open(tiny_family)
    try:
        assert engine.attention.flash_attn is False
        measured = profile_for(engine)  # (a tiny model: timed after a long context too, so priced from its own)
        assert measured.long_context == 128
        # As a model too slow to time after a long context would have it cached: no long-context timing.
        save(CostProfile(measured.seconds, switch_seconds=measured.switch_seconds, key=measured.key))
        priced = profile_for(engine)
    finally:
        engine.close()
    assert priced.from_cache and priced.long_context == attention.PROBE_CONTEXT
    assert priced.long_seconds == {1: 0.003, 5: 0.004}
    stored = load_cached(priced.key)  # (the cache keeps the profile as measured: the timing may be timed again)
    assert stored is not None and stored.seconds == priced.seconds and not stored.long_seconds
