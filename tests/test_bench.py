"""`specdec bench` and specdec_gguf.benchmark: the figures the README and docs/performance.md quote.

Timings are never asserted (they vary); what is asserted is the documented arithmetic
(docs/metrics.md, "Benchmark figures") on synthetic trials, the interleaved order of
the trials, and the command's output contract on tiny models.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from typer.testing import CliRunner

from specdec_cli.app import app
from specdec_gguf.benchmark import Strategy, Trial, peer_strategy, run_trials, summarize
import specdec_gguf.profile as profile_mod
from specdec_gguf.errors import ConfigError
from specdec_gguf.settings import DrafterSettings

PLAIN = Strategy("plain", DrafterSettings(kind="none"))
LOOKUP_K2 = Strategy("lookup k=2", DrafterSettings(kind="prompt-lookup", num_draft_tokens=2, adaptive=False))
LOOKUP_K4 = Strategy("lookup k=4", DrafterSettings(kind="prompt-lookup", num_draft_tokens=4, adaptive=False))
LOOKUP_ADAPTIVE = Strategy("lookup adaptive", DrafterSettings(kind="prompt-lookup", num_draft_tokens=8, adaptive=True))
PEER = peer_strategy()
STRATEGIES = [PLAIN, LOOKUP_K2, LOOKUP_K4, LOOKUP_ADAPTIVE, PEER]


def trials_for(name: str, per_prompt: dict[str, list[float]], tokens: dict[str, tuple[int, ...]],
               tokens_per_pass: float = 1.0) -> list[Trial]:
    return [Trial(name, pid, rep, rate, 0.5, tokens_per_pass, 0.0, tokens[pid])
            for pid, rates in per_prompt.items() for rep, rate in enumerate(rates)]


def synthetic_trials() -> list[Trial]:
    same = {"a": (1, 2, 3), "b": (4, 5, 6)}
    return (trials_for("plain", {"a": [100, 110, 90], "b": [50, 60, 40]}, same)
            + trials_for("lookup k=2", {"a": [200, 190, 300], "b": [50, 45, 75]}, {"a": (1, 2, 3), "b": (4, 5, 7)},
                         tokens_per_pass=2.4)
            + trials_for("lookup k=4", {"a": [150, 150, 150], "b": [80, 80, 80]}, same, tokens_per_pass=3.0)
            + trials_for("lookup adaptive", {"a": [300, 300, 300], "b": [100, 100, 100]}, same, tokens_per_pass=3.0)
            + trials_for(PEER.name, {"a": [120, 120, 120], "b": [60, 60, 60]}, {"a": (), "b": ()}))


def test_speedup_is_the_geometric_mean_of_per_prompt_median_ratios():
    """docs/metrics.md: 'vs plain' = geometric mean over prompts of median(strategy) / median(plain).

    Fails for a ratio of overall medians (1.77x here), of overall means (1.91x), or an arithmetic
    mean of the per-prompt ratios (1.5x) instead of 1.41x."""
    reports = {r.name: r for r in summarize(synthetic_trials(), STRATEGIES)}
    lookup = reports["lookup k=2"]
    assert lookup.per_prompt_speedup == pytest.approx({"a": 2.0, "b": 1.0})
    assert lookup.speedup == pytest.approx(math.sqrt(2.0))
    assert lookup.median_throughput == pytest.approx(132.5)  # median over all its trials
    assert lookup.tokens_per_target_pass == pytest.approx(2.4)
    plain = reports["plain"]
    assert plain.speedup == 1.0 and plain.per_prompt_speedup == {"a": 1.0, "b": 1.0}
    assert plain.greedy_match == 1.0
    assert lookup.greedy_match == 0.5  # prompt b's output differs from plain's
    assert lookup.same_output == {"a": True, "b": False} and plain.same_output == {"a": True, "b": True}
    peer = reports[PEER.name]
    assert peer.speedup == pytest.approx(math.sqrt(1.2 * 1.2)) and peer.greedy_match is None  # not our output


def test_paired_ratios_divide_each_trial_by_the_plain_trial_of_its_repeat():
    """docs/metrics.md 'paired': per prompt the median over repeats of trial / plain trial of the same repeat.
    A host that runs a whole repeat slower moves both alike: an arm that computes what plain does reads 1.0
    paired, while its ratio of medians reads the drift (here 0.8). Fails for a ratio of medians, or pairing
    across repeats."""
    same = {"a": (1,), "b": (2,)}
    drift = {"a": [100, 50, 100], "b": [100, 100, 50]}  # each prompt's slow repeat: a different one
    twin = {"a": [100, 50, 100], "b": [80, 100, 50]}  # the same drift; b's first trial caught a blip
    trials = trials_for("plain", drift, same) + trials_for("lookup k=2", twin, same) \
        + trials_for(PEER.name, {"a": [100, 100, 100], "b": [100, 100, 100]}, {"a": (), "b": ()})
    reports = {r.name: r for r in summarize(trials, [PLAIN, LOOKUP_K2, PEER])}
    twin_report = reports["lookup k=2"]
    assert twin_report.per_prompt_paired == pytest.approx({"a": 1.0, "b": 1.0})  # medians of (1, 1, 1), (0.8, 1, 1)
    assert twin_report.paired_speedup == pytest.approx(1.0)
    assert twin_report.per_prompt_speedup == pytest.approx({"a": 1.0, "b": 0.8})  # (median 80 over median 100)
    assert reports["plain"].paired_speedup == pytest.approx(1.0)


def test_paired_by_repeat_spans_the_lowest_and_highest_repeat_of_the_paired_geomean():
    """docs/metrics.md 'paired by repeat': per repeat, the geomean over prompts of trial / plain trial of that
    repeat; the lowest and highest over the repeats where every prompt has a pair. Here repeat 0 reads
    sqrt(2 * 0.5) = 1, repeat 1 sqrt(1 * 1.5), repeat 2 sqrt(1.2 * 1.2); repeat 3 lacks prompt b and does not
    count. Fails for a range over single trials (0.5-2.0), over per-prompt medians, or one that counts a
    repeat missing a prompt (0.9)."""
    same = {"a": (1,), "b": (2,)}
    plain = {"a": [100, 100, 100, 100], "b": [100, 100, 100]}
    arm = {"a": [200, 100, 120, 90], "b": [50, 150, 120]}
    trials = trials_for("plain", plain, same) + trials_for("lookup k=2", arm, same) \
        + trials_for(PEER.name, {"a": [100] * 4, "b": [100] * 3}, {"a": (), "b": ()})
    reports = {r.name: r for r in summarize(trials, [PLAIN, LOOKUP_K2, PEER])}
    assert reports["lookup k=2"].paired_spread == pytest.approx((1.0, math.sqrt(1.5)))
    assert reports["plain"].paired_spread == pytest.approx((1.0, 1.0))
    assert reports[PEER.name].paired_spread is None  # (its trials are not paired with plain's)


def test_paired_in_steps_compares_each_answers_time_in_its_own_plain_steps():
    """docs/metrics.md 'paired in steps': per prompt the median over repeats of the plain trial's time in its own
    plain steps over this trial's (Trial.in_plain_steps), geomean over prompts. Throughputs that drift with the
    host do not move it; a trial with too few plain steps to price one by (None) is left out, and a prompt with
    none leaves the geomean undefined. Fails if throughput entered it, or a None counted."""
    same = {"a": (1,), "b": (2,)}
    plain = [dataclasses.replace(t, in_plain_steps=64.0)
             for t in trials_for("plain", {"a": [100, 50, 100], "b": [100, 100, 100]}, same)]
    steps = {("a", 0): 64.0, ("a", 1): 80.0, ("a", 2): None, ("b", 0): 66.0, ("b", 1): 64.0, ("b", 2): 70.0}
    arm = [dataclasses.replace(t, in_plain_steps=steps[(t.prompt_id, t.repeat)])
           for t in trials_for("lookup k=2", {"a": [50, 100, 300], "b": [10, 100, 100]}, same)]
    report = {r.name: r for r in summarize(plain + arm, [PLAIN, LOOKUP_K2])}["lookup k=2"]
    assert report.per_prompt_in_steps == pytest.approx({"a": (1.0 + 0.8) / 2, "b": 64 / 66})
    assert report.paired_in_steps == pytest.approx(math.sqrt(0.9 * 64 / 66))
    lone = [t for t in arm if t.prompt_id == "a"] + [dataclasses.replace(t, in_plain_steps=None) for t in arm
                                                     if t.prompt_id == "b"]
    report = {r.name: r for r in summarize(plain + lone, [PLAIN, LOOKUP_K2])}["lookup k=2"]
    assert "b" not in report.per_prompt_in_steps and report.paired_in_steps is None


def test_adaptive_is_compared_with_the_best_fixed_k_of_each_prompt():
    """docs/usage.md: adaptive's ratio to the best fixed k *of each prompt* (k=2 on a, k=4 on b),
    and its geometric mean. Fails for one best k over all prompts (1.5 and 1.25 would become
    1.5 and 2.0 with k=2 alone, or 2.0 and 1.25 with k=4 alone)."""
    reports = {r.name: r for r in summarize(synthetic_trials(), STRATEGIES)}
    adaptive = reports["lookup adaptive"]
    assert adaptive.vs_best_fixed == pytest.approx({"a": 300 / 200, "b": 100 / 80})
    assert adaptive.vs_best_fixed_geomean == pytest.approx(math.sqrt(1.5 * 1.25))
    assert reports["lookup k=2"].vs_best_fixed == {} and reports["lookup k=2"].vs_best_fixed_geomean is None


def test_a_fixed_k_that_wrote_another_answer_is_not_the_best_fixed_k():
    """A fixed k whose output on a prompt differs from plain's (its batched passes tipped a near-tie) is
    left out of that prompt's best fixed k: the comparison is on the same answer. Prompt b: k=2 (75
    tok/s at best, another answer) would be the best; k=4 (80) is, as before. Make k=2 the fastest on
    b and it still doesn't count; where no fixed k kept plain's output, all count."""
    trials = synthetic_trials()
    faster = [dataclasses.replace(t, throughput=400.0) if t.strategy == "lookup k=2" and t.prompt_id == "b" else t
              for t in trials]
    adaptive = {r.name: r for r in summarize(faster, STRATEGIES)}["lookup adaptive"]
    assert adaptive.vs_best_fixed["b"] == pytest.approx(100 / 80)  # not 100 / 400
    drifted = [dataclasses.replace(t, tokens=(9,)) if t.strategy == "lookup k=4" and t.prompt_id == "b" else t
               for t in faster]
    adaptive = {r.name: r for r in summarize(drifted, STRATEGIES)}["lookup adaptive"]
    assert adaptive.vs_best_fixed["b"] == pytest.approx(100 / 400)  # nothing like-for-like left: all count


def test_an_output_that_drifted_in_a_later_trial_is_not_plains():
    """Adaptive's pass sizes follow the timings, so one trial may write plain's answer and the next
    another: the prompt counts as not matching. Fails when only the first trial is compared."""
    trials = [dataclasses.replace(t, tokens=(9,)) if t.strategy == "lookup adaptive" and t.prompt_id == "a"
              and t.repeat == 2 else t for t in synthetic_trials()]
    adaptive = {r.name: r for r in summarize(trials, STRATEGIES)}["lookup adaptive"]
    assert adaptive.same_output == {"a": False, "b": True} and adaptive.greedy_match == 0.5


def test_the_per_prompt_table_marks_an_output_that_is_not_plains():
    """A speed measured on another answer (k=2 on prompt b) is marked, so nobody reads it as like for like."""
    from rich.console import Console

    from specdec_cli.bench import per_prompt_table

    console = Console(width=200, record=True)
    console.print(per_prompt_table(summarize(synthetic_trials(), STRATEGIES)))
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines() if line.count("│") > 2}
    assert "≠" in rows["lookup k=2"].split("│")[3] and "≠" not in rows["lookup k=2"].split("│")[2]
    assert "≠" not in rows["lookup k=4"] and "≠" not in rows[PEER.name]


def test_trials_are_interleaved_after_a_warm_up(tiny_engines):
    """Every strategy runs on a prompt before any runs it again (A B C A B C), repeat after repeat,
    so a slow stretch of the machine hits all of them alike. Fails for strategy-major loops."""
    target, draft = tiny_engines
    strategies = [PLAIN, Strategy("draft k=2", DrafterSettings(kind="draft-model", num_draft_tokens=2,
                                                              adaptive=False)), LOOKUP_K2]
    prompts = [("x", target.tokenize("the model is")), ("y", target.tokenize("the draft was"))]
    seen = []
    trials = run_trials(target, draft, strategies, prompts, 6, 2, on_trial=seen.append)  # cold: the default
    assert [(t.repeat, t.prompt_id, t.strategy) for t in trials] == [
        (rep, pid, s.name) for rep in range(2) for pid in ("x", "y") for s in strategies]
    assert seen == trials
    assert all(len(t.tokens) == 6 for t in trials)  # end-of-generation ignored: every trial is full length
    assert all(t.throughput > 0 for t in trials)


def test_seeded_sampled_trials_draw_another_answer_each_repeat_and_alike_within_one(tiny_engines):
    """Seeded, repeat r samples with seed + r: the strategies of a repeat start from the same generator state
    (two plain strategies write the same answer), each repeat draws another answer (one sampled answer timed
    over and over would average only the timing, not its draws' luck), and the same seed repeats it all."""
    from specdec_gguf.sampling import SamplingParams

    target, _ = tiny_engines
    strategies = [PLAIN, Strategy("plain again", DrafterSettings(kind="none"))]
    prompts = [("x", target.tokenize("the model is"))]
    sampling = SamplingParams(temperature=1.5, seed=7)
    trials = run_trials(target, None, strategies, prompts, 12, 3, sampling)
    answers = [[t.tokens for t in trials if t.repeat == rep] for rep in range(3)]
    assert all(first == second for first, second in answers)
    assert len({first for first, _ in answers}) == 3
    again = run_trials(target, None, strategies, prompts, 12, 3, sampling)
    assert [t.tokens for t in again] == [t.tokens for t in trials]


def _seen_at_each_generate(monkeypatch, look) -> list:
    """What ``look(decoder)`` saw as each ``SpeculativeDecoder.generate`` began, in order."""
    from specdec_gguf.decoder import SpeculativeDecoder

    generate, seen = SpeculativeDecoder.generate, []

    def spy(self, *args, **kwargs):
        seen.append(look(self))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", spy)
    return seen


@pytest.mark.parametrize("cold", [True, False])
def test_cold_trials_each_prefill_their_prompt(tiny_engines, monkeypatch, cold):
    """Cold, every trial starts from empty caches and prefills its prompt as `specdec run` does: a trial
    that reused the previous one's cached prompt skipped the prefill's after-effects, so the strategy
    first per prompt (plain) ran slower than the rest. Warm (the negative control), the caches carry over."""
    target, draft = tiny_engines
    cached = _seen_at_each_generate(monkeypatch, lambda decoder: (target.n_past, draft.n_past))
    strategies = [PLAIN, Strategy("draft k=2", DrafterSettings(kind="draft-model", num_draft_tokens=2,
                                                              adaptive=False)), LOOKUP_K2]
    run_trials(target, draft, strategies, [("x", target.tokenize("the model is"))], 4, 2, cold=cold)
    trials = cached[-len(strategies) * 2:]  # (after the warm-up runs)
    assert all(state == (0, 0) for state in trials) == cold


def test_a_strategys_constants_and_remember_reach_its_decoders(tiny_engines, monkeypatch):
    """``Strategy(constants=, remember=)``: the decoders of its trials get that schedule and read and write
    no calibrations; a strategy without them gets the shipped constants and the store (the negative
    control). What benchmarks/ab_constants.py and remembered.py compare."""
    from specdec_gguf.schedule import ScheduleConstants

    target, _ = tiny_engines
    tuned = ScheduleConstants(guard_quiet_pause=32, margin=0.05)
    strategies = [PLAIN, Strategy("tuned", DrafterSettings(kind="prompt-lookup"), constants=tuned, remember=False),
                  Strategy("shipped", DrafterSettings(kind="prompt-lookup"))]
    seen = _seen_at_each_generate(
        monkeypatch, lambda decoder: (getattr(decoder.schedule, "c", None), decoder._calibration_key is not None))
    run_trials(target, None, strategies, [("x", target.tokenize("the model is"))], 4, 1)
    assert seen[-2:] == [(tuned, False), (ScheduleConstants(), True)]


runner = CliRunner()


def bench(family, *args: str):
    return runner.invoke(app, ["bench", "-m", str(family.target), "-md", str(family.draft), "--k", "1,2",
                               "--adaptive-k", "3", "--repeats", "2", "-n", "8", "-c", "1024", "-t", "1",
                               "--only", "code-edit,story", *args])


def test_bench_json_contract(tiny_family):
    """--json: one object with a report per strategy (plain first, the k sweep and adaptive for each
    drafter), per-prompt speed-ups for the chosen prompts, and the run's settings; each speed-up is
    the geometric mean of its per-prompt figures, plain's is 1."""
    result = bench(tiny_family, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {"reports", "prompts", "max_tokens", "repeats", "cold"} <= set(out)
    assert out["prompts"] == ["code-edit", "story"] and out["max_tokens"] == 8 and out["repeats"] == 2
    assert out["cold"] is True
    names = [r["name"] for r in out["reports"]]
    assert names == ["plain", "draft k=1", "draft k=2", "draft adaptive", "lookup k=1", "lookup k=2",
                     "lookup adaptive"]
    for report in out["reports"]:
        per_prompt = report["per_prompt_speedup"]
        assert list(per_prompt) == ["code-edit", "story"]
        assert report["speedup"] == pytest.approx(math.prod(per_prompt.values()) ** 0.5)
        assert report["median_throughput"] > 0
        assert 0.0 <= report["greedy_match"] <= 1.0
        if report["name"].endswith("adaptive"):
            assert list(report["vs_best_fixed"]) == ["code-edit", "story"]
        else:  # (plain drafts nothing, a fixed k verifies every proposal whole: no declined rounds)
            assert report["declined"] == 0
        assert 0.0 <= report["draft_share"] < 1.0
        by_verified = report["passes_by_verified"]  # (mean passes per answer by drafted tokens verified)
        if " k=" in report["name"]:
            assert len(by_verified) <= int(report["name"].rsplit("=", 1)[1]) + 1
        assert sum(by_verified) * report["tokens_per_target_pass"] == pytest.approx(8, rel=0.5)
    plain = out["reports"][0]
    assert plain["speedup"] == 1.0 and set(plain["per_prompt_speedup"].values()) == {1.0}
    assert plain["greedy_match"] == 1.0 and plain["tokens_per_target_pass"] == 1.0
    assert plain["passes_by_verified"] == [8.0]  # (8 tokens, a plain step each)


def test_sampled_trials_are_not_compared_with_plain_output():
    """Sampled, a strategy's output differs from plain decoding's wherever the draws fell differently:
    no "same as plain" figures, and every fixed k counts for the best fixed k (greedy: only those
    that kept plain's answer; here k = 2 wrote another answer on prompt b, faster than k = 4's).
    Fails if sampled runs were held to plain's output (adaptive against k = 4 there: 1.25x, not 0.83x)."""
    trials = [t if (t.strategy, t.prompt_id) != ("lookup k=2", "b") else dataclasses.replace(t, throughput=120.0)
              for t in synthetic_trials()]
    greedy = {r.name: r for r in summarize(trials, STRATEGIES)}
    sampled = {r.name: r for r in summarize(trials, STRATEGIES, greedy=False)}
    assert greedy["lookup adaptive"].vs_best_fixed["b"] == pytest.approx(100 / 80)
    assert sampled["lookup adaptive"].vs_best_fixed["b"] == pytest.approx(100 / 120)  # k = 2 counts too
    for report in sampled.values():
        assert report.greedy_match is None and report.same_output == {}
    assert sampled["lookup adaptive"].speedup == greedy["lookup adaptive"].speedup
    assert sampled[PEER.name].peer and not sampled["lookup adaptive"].peer


def test_bench_samples_when_asked(tiny_family):
    """--temp: every strategy samples with those settings (the JSON says which), none is compared with
    plain decoding's output, and the table title names the sampling."""
    result = bench(tiny_family, "--json", "--temp", "0.8", "--top-k", "40", "--seed", "5", "--no-prompt-lookup")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["sampling"] == {"temperature": 0.8, "top_k": 40, "top_p": 1.0, "min_p": 0.0, "seed": 5}
    assert [r["name"] for r in out["reports"]] == ["plain", "draft k=1", "draft k=2", "draft adaptive"]
    assert all(r["greedy_match"] is None and r["same_output"] == {} for r in out["reports"])
    table = bench(tiny_family, "--temp", "0.8", "--no-prompt-lookup")
    assert table.exit_code == 0, table.output
    assert "specdec bench (temperature 0.8, cold" in table.stdout


def test_bench_tables(tiny_family):
    """Without --json: the strategy table, the per-prompt speed-up table (a column per prompt,
    adaptive / best fixed k rows) and the bar chart."""
    result = bench(tiny_family, "--no-prompt-lookup")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "specdec bench (greedy, cold" in out and "speed-up over plain, per prompt" in out
    per_prompt = out[out.index("speed-up over plain, per prompt"):]
    assert "code-edit" in per_prompt and "story" in per_prompt and "explain" not in per_prompt
    for name in ("plain", "draft k=1", "draft k=2", "draft adaptive", "draft adaptive / best fixed k"):
        assert name in per_prompt
    assert "lookup" not in out
    assert "speed-up over plain decoding:" in out


def test_bench_plain_twice_times_plain_decoding_again_beside_the_first(tiny_family):
    """--plain-twice: a second plain row ("plain again"), interleaved with the rest, read over the first plain
    (which every ratio stays over): its paired ratio and spread are the machine's noise. Fails if the row were
    missing, came first (then the baseline), or were counted as a drafter (acceptance, best fixed k)."""
    result = bench(tiny_family, "--json", "--plain-twice", "--no-prompt-lookup")
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)["reports"]
    assert [r["name"] for r in reports] == ["plain", "plain again", "draft k=1", "draft k=2", "draft adaptive"]
    assert [r["plain"] for r in reports] == [True, True, False, False, False]  # (what the table tells rows by)
    again = reports[1]
    assert again["passes_by_verified"] == [8.0] and again["vs_best_fixed_geomean"] is None
    low, high = again["paired_spread"]
    assert 0 < low <= high and again["paired_speedup"] > 0 and reports[0]["speedup"] == 1.0
    table = bench(tiny_family, "--plain-twice", "--no-prompt-lookup")
    assert table.exit_code == 0 and "plain again" in table.stdout


@pytest.mark.parametrize("args, message", [
    (["--k", "1,x"], r"--k '1,x' must be comma-separated integers"),
    (["--k", "0"], r"--k values \(0\), --repeats \(2\) and -n \(8\) must be >= 1"),
    (["--only", "nope"], r"--only 'nope' matches no prompt id"),
    (["--peer", "vllm"], r"--peer 'vllm' must be one of"),
    (["--set", "huge"], r"--set 'huge' must be one of"),
    (["--temp", "0.8", "--peer", "llama.cpp"], r"--peer runs greedy decoding only; drop it or --temp 0.8"),
    (["--temp", "-1"], r"temperature"),
])
def test_bench_errors_are_one_line(tiny_family, args, message):
    import re

    result = runner.invoke(app, ["bench", "-m", str(tiny_family.target), "-n", "8", "--repeats", "2", *args])
    assert result.exit_code == 1
    assert re.search(message, result.stderr), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _fake_peer(tmp_path, lines_per_run: list[str], status: int = 0):
    """A stand-in for llama-speculative-simple whose n-th run prints ``lines_per_run[n]`` (the last one
    from then on) and exits ``status``; returns the peer and the file counting its runs."""
    from specdec_gguf.peers import LlamaCppPeer

    runs = tmp_path / "runs"
    runs.write_text("0")
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    for i, text in enumerate(lines_per_run):
        (outputs / str(i)).write_text(text)
    script = tmp_path / "llama-speculative-simple"
    last = len(lines_per_run) - 1
    script.write_text(f"""#!/bin/sh
n=$(cat {runs}); echo $((n + 1)) > {runs}
i=$n; [ "$i" -gt {last} ] && i={last}
cat {outputs}/$i >&2
exit {status}
""")
    script.chmod(0o755)
    return LlamaCppPeer(script, tmp_path / "model.gguf", "ngram-simple", repack=True), runs


SPEED = "decoded   64 tokens in    0.500 seconds, speed:  128.000 t/s\nn_drafted = 40\nn_accept = 30\n"


@pytest.mark.parametrize("first, status, runs, error", [
    ("loading draft model\n", 0, 2, None),  # a run whose log lost its timing line: run again
    (SPEED, 0, 1, None),
    ("loading draft model\n", 1, 1, "failed (exit 1)"),  # a failure is not retried
])
def test_a_peer_run_whose_log_lost_its_timing_line_runs_again(tmp_path, first, status, runs, error):
    """llama.cpp's log now and then drops every line after the draft model loads (exit 0, no timing
    line): the run is repeated, so one such run does not leave a matrix cell without its peer.
    Negative controls: a run with its timing line runs once; one that fails (exit 1) is not retried."""
    from specdec_gguf.errors import EngineError

    peer, counter = _fake_peer(tmp_path, [first, SPEED], status)
    if error:
        with pytest.raises(EngineError, match=error.replace("(", r"\(").replace(")", r"\)")):
            peer.run("x", 64)
    else:
        result = peer.run("x", 64)
        assert (result.tokens, result.throughput, result.drafted, result.accepted) == (64, 128.0, 40, 30)
    assert int(counter.read_text()) == runs


def test_a_peer_that_never_prints_its_timing_line_fails_after_its_retries(tmp_path):
    from specdec_gguf.errors import EngineError
    from specdec_gguf.peers import LOST_LOG_RETRIES

    peer, counter = _fake_peer(tmp_path, ["loading draft model\n"])
    with pytest.raises(EngineError, match="exit 0"):
        peer.run("x", 64)
    assert int(counter.read_text()) == LOST_LOG_RETRIES + 1


@pytest.mark.parametrize("exact", [True, False])
def test_an_exact_peer_runs_with_our_exact_targets_settings(tmp_path, monkeypatch, exact):
    """`specdec bench --exact` runs llama.cpp's peer with exact mode's batch-invariant settings (flash
    attention, repacking and the tiled K-quant matmul off), so both sides run the same kernels; without
    it the peer keeps llama.cpp's own settings (negative control)."""
    from specdec_gguf.peers import LlamaCppPeer

    monkeypatch.delenv("GGML_CPU_TILED_MM", raising=False)
    seen = tmp_path / "seen"
    script = tmp_path / "llama-speculative-simple"
    script.write_text(f"""#!/bin/sh
echo "$@" > {seen}; echo "tiled=${{GGML_CPU_TILED_MM:-unset}}" >> {seen}
printf '{SPEED}' >&2
""".replace("\n\n", "\n"))
    script.chmod(0o755)
    peer = LlamaCppPeer(script, tmp_path / "model.gguf", "ngram-simple", repack=True, exact=exact)
    assert peer.run("x", 64).throughput == 128.0
    args, tiled = seen.read_text().splitlines()
    assert ("--flash-attn off" in args) is exact
    assert ("--no-repack" in args.split()) is exact
    assert tiled == ("tiled=0" if exact else "tiled=unset")


def test_a_peer_run_keeps_the_answer_it_printed_after_the_prompt(tmp_path):
    """llama-speculative-simple prints the prompt, then the answer: ``PeerRun.answer`` is what follows the
    prompt (what benchmarks/greedy_match.py compares with plain decoding's text); None when the prompt was
    not printed (negative control)."""
    from specdec_gguf.peers import LlamaCppPeer

    script = tmp_path / "llama-speculative-simple"
    script.write_text(f"""#!/bin/sh
printf '\\n\\n<bos>Say hi.\\n\\nHi there!\\n\\n\\n\\n'
printf '{SPEED}' >&2
""")
    script.chmod(0o755)
    run = LlamaCppPeer(script, tmp_path / "model.gguf", "ngram-simple", repack=True).run("Say hi.", 64)
    assert run.answer("Say hi.") == "\n\nHi there!\n\n\n\n"
    assert run.answer("Say hi.").startswith("\n\nHi there!")
    assert run.answer("Say bye.") is None


def _benchmark(name: str):
    """A script of benchmarks/ as a module (they import each other by name, so their folder goes on the path)."""
    import importlib
    import sys
    from pathlib import Path

    folder = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def test_the_ngram_cache_replica_drafts_what_followed_and_stops_where_the_counts_disagree():
    """benchmarks/ngram_cache_sim.py's replica of llama.cpp's ngram-cache: each drafted token is what most
    often followed the longest n-gram before it, drafting goes on past the context's end (the drafted
    tokens extend the n-grams), and stops where no n-gram's counts pass llama.cpp's thresholds (a
    three-way fork: 33% < 50%). On a copy it beats plain decoding in the simulation and keeps the target's
    output (the script asserts it)."""
    sim = _benchmark("ngram_cache_sim")
    NgramCacheDrafter, ngram_cache_seconds = sim.NgramCacheDrafter, sim.ngram_cache_seconds
    from specdec_gguf.simulation import simulate_run, synthetic_traces

    drafter = NgramCacheDrafter()
    drafter.start([5, 6, 7, 8, 9, 5, 6, 7])
    assert drafter.propose(4).tokens == (8, 9, 5, 6)
    drafter.start([1, 2, 3, 4, 1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3])
    assert drafter.propose(4).tokens == ()
    drafter.accept(0, [4])  # the fork resolved: (3, 4) was followed by 1 every time
    assert drafter.propose(2).tokens == (1, 2)
    copy = next(t for t in synthetic_traces() if t.id == "copy-rename")
    assert ngram_cache_seconds(copy, "gemma-epyc", 128) < simulate_run(copy, "gemma-epyc", 128, 0).seconds


def test_ab_lookup_arms_set_the_drafters_attributes_named():
    """benchmarks/ab_lookup.py's ``--arm NAME:attribute=value,...``: values are Python literals, set on the
    arm's PromptLookupDrafter; an attribute the drafter has not, a value that is no literal, or a reserved
    arm name stops the script before anything runs (a misspelt arm would otherwise time the shipped drafter
    twice)."""
    parse_arm = _benchmark("ab_lookup").parse_arm

    assert parse_arm("long-only:short_matches_from=None") == ("long-only", {"short_matches_from": None})
    assert parse_arm("both:follow_loops=False,short_matches_from=0.005") == (
        "both", {"follow_loops": False, "short_matches_from": 0.005})
    for bad in ("x:short_matches=None", "x:follow_loops=maybe", "plain:follow_loops=False", ":follow_loops=False"):
        with pytest.raises(SystemExit):
            parse_arm(bad)


def _oracle_module():
    return _benchmark("oracle")


def test_the_oracle_drafts_the_answer_so_every_pass_holds_k_plus_one_tokens(target):
    """benchmarks/oracle.py's ceiling: proposing plain decoding's own answer, every drafted token is accepted
    and the answer is plain's, in one pass per k + 1 tokens (fails if the oracle drafted less, or anything
    but the answer)."""
    from specdec_gguf.decoder import SpeculativeDecoder

    oracle = _oracle_module()
    prompt, n, k = [1, 2, 3], 40, 7
    answer = list(SpeculativeDecoder(target).generate(prompt, n, ignore_eog=True).tokens)
    result = oracle.oracle_decoder(target, answer, k).generate(prompt, n, ignore_eog=True)
    assert list(result.tokens) == answer
    assert result.stats.drafted == result.stats.accepted == n - result.stats.target_passes
    assert result.stats.target_passes == -(-n // (k + 1))


def test_the_oracle_stops_drafting_where_the_output_parts_from_its_answer(target):
    """Given an answer wrong from token 10 on, the oracle's drafts are rejected there and it drafts nothing
    after (the output is the target's own); ``settled`` then gives it the answer it decodes to, which it
    drafts to the end."""
    from specdec_gguf.decoder import SpeculativeDecoder

    oracle = _oracle_module()
    prompt, n, k = [1, 2, 3], 40, 4
    answer = list(SpeculativeDecoder(target).generate(prompt, n, ignore_eog=True).tokens)
    wrong = answer[:10] + [(t + 1) % target.n_vocab for t in answer[10:]]
    result = oracle.oracle_decoder(target, wrong, k).generate(prompt, n, ignore_eog=True)
    assert list(result.tokens) == answer
    # Two passes of k + 1 right tokens, a third whose first drafted token (the 11th) is wrong, then plain steps.
    assert (result.stats.drafted, result.stats.accepted) == (3 * k, 2 * k)
    assert result.stats.target_passes == 3 + n - 11
    assert oracle.settled(target, prompt, wrong, k, n) == answer


def test_copyable_runs_measure_each_answer_tokens_longest_copy_of_the_context_before_it():
    """The copy oracle's runs: from each answer position, the longest stretch some earlier place of the prompt
    or answer is followed by (a token seen nowhere before: 0); the copy oracle drafts runs of at least
    ``min_run`` tokens, each pass ending with the target's own token."""
    oracle = _oracle_module()
    prompt, answer = [1, 2, 3, 4, 5], [9, 2, 3, 4, 7, 2, 3]
    runs = oracle.copyable_runs(prompt, answer)
    assert runs == [0, 3, 2, 1, 0, 2, 1]
    assert oracle.copy_oracle_drafts(runs, k=8, min_run=2) == 3 + 1  # (the last token is always the target's)
    assert oracle.copy_oracle_drafts(runs, k=2, min_run=2) == 2 + 1
    assert oracle.copy_oracle_drafts(runs, k=8, min_run=4) == 0


def test_ab_constants_gives_each_arm_a_calibration_store_of_its_own(tiny_engines, tmp_path, monkeypatch):
    """benchmarks/ab_constants.py: a decoder made for an arm reads and writes that arm's calibration store
    (each a copy of the one it starts from), not one shared by every arm, where each arm's run read what
    the arm before it had just learned on the same prompt (two identical arms ran 1.215x and 1.317x plain).
    Fails if the arms shared a store or one started empty."""
    import specdec_gguf.benchmark as benchmark_module
    import specdec_gguf.calibrations as calibrations_module
    from specdec_gguf.benchmark import Strategy
    from specdec_gguf.settings import DrafterSettings

    ab = _benchmark("ab_constants")
    monkeypatch.setattr(benchmark_module, "make_decoder", benchmark_module.make_decoder)  # (restored after)
    monkeypatch.setattr(calibrations_module, "store_dir", calibrations_module.store_dir)
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    start = tmp_path / "remembered"
    start.mkdir()
    (start / "pair.json").write_text("{}")
    arms = [Strategy(name, DrafterSettings(kind="prompt-lookup")) for name in ("shipped", "variant")]
    ab.own_stores(arms, tmp_path / "stores", start)
    target, _ = tiny_engines
    for arm in arms + arms[::-1]:
        benchmark_module.make_decoder(target, arm.drafter)
        assert calibrations_module.store_dir() == tmp_path / "stores" / arm.name
        assert (calibrations_module.store_dir() / "pair.json").read_text() == "{}"
    benchmark_module.make_decoder(target, DrafterSettings(kind="none"))  # (the warm-up's plain decoder)
    assert calibrations_module.store_dir() not in {tmp_path / "stores" / arm.name for arm in arms}


def test_ab_constants_plain_twice_adds_a_second_plain_arm_read_over_the_first():
    """benchmarks/ab_constants.py --plain-twice: a second plain arm ("plain again") beside the first, which every
    ratio stays over; its paired spread is the host's noise. Fails if the flag added nothing, or if the new arm
    came first (then it would be the one every ratio is over)."""
    from specdec_gguf.schedule import ScheduleConstants

    ab = _benchmark("ab_constants")
    variants = {"shipped": ScheduleConstants()}
    without = ab.arms("draft-model", [4], variants, [])
    with_null = ab.arms("draft-model", [4], variants, [], plain_twice=True)
    assert [s.name for s in with_null] == [without[0].name, without[1].name, "plain again", "shipped"]
    assert with_null[0].is_plain and with_null[2].is_plain and not with_null[1].is_plain
    same = {"a": (1,)}
    trials = trials_for("plain", {"a": [100, 100]}, same) + trials_for("plain again", {"a": [95, 105]}, same)
    report = {r.name: r for r in summarize(trials, with_null)}["plain again"]
    assert report.paired_spread == pytest.approx((0.95, 1.05))


def test_fresh_starts_runs_each_process_on_an_empty_cache_of_its_own_and_counts_the_stalls(monkeypatch, tmp_path, capsys):
    """benchmarks/fresh_starts.py: every child process of every arm gets a user cache folder of its own that does
    not exist yet (a user's first run), the arms' order alternates between processes, and an answer counts as
    stalled when half its tokens or more came from plain steps. Fails if two processes shared a cache (the second
    would start from the first's profile and calibration) or if the count read the wrong side of the share."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    fresh = _benchmark("fresh_starts")
    from specdec_gguf.stats import SpecStats

    answer = SpecStats()
    for _ in range(3):
        answer.record_round(1, 1, 2)
    for _ in range(4):
        answer.record_round(3, 3, 4)
    for _ in range(7):
        answer.record_round(0, 0, 1, declined=True)
    for _ in range(3):
        answer.record_round(0, 0, 1)
    assert answer.generated_tokens == 32 and answer.target_passes == 17
    assert fresh.plain_share(answer) == pytest.approx(10 / 32)  # 7 passes verified drafts, 10 plain
    plain = SpecStats()
    for _ in range(32):
        plain.record_round(0, 0, 1)
    assert fresh.plain_share(plain) == 1.0
    calls, seeds = [], []

    def run(command, env, capture_output, text):
        cache = Path(env["SPECDEC_CACHE_DIR"])
        arm = command[command.index("--child") + 1]
        calls.append((arm, cache, cache.exists()))
        seeds.append(int(command[command.index("--seed") + 1]))
        lines = [{"prompt": "p1", "ms": 10.0, "plain": 0.5 if arm == "shipped" else 0.49},
                 {"prompt": "p2", "ms": 20.0, "plain": 0.1}]
        return SimpleNamespace(returncode=0, stdout="\n".join(json.dumps(line) for line in lines), stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    target = tmp_path / "t.gguf"
    monkeypatch.setattr(sys, "argv", ["fresh_starts.py", str(target), "--kind", "prompt-lookup", "--processes", "3",
                                      "--variant", "other:cold_proposals=1"])
    fresh.main()
    assert [arm for arm, _, _ in calls] == ["shipped", "other:cold_proposals=1", "other:cold_proposals=1", "shipped",
                                            "shipped", "other:cold_proposals=1"]
    assert len({cache for _, cache, _ in calls}) == 6 and not any(existed for _, _, existed in calls)
    assert seeds == [0, 0, 1, 1, 2, 2]  # (a process's arms sample alike; each process draws other answers)
    rows = {line.split()[0]: line.split()[1:6] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows == {"shipped": ["3", "of", "6", "(p1=3", "p2=0);"], "other": ["0", "of", "6", "(p1=0", "p2=0);"]}


def test_the_matrix_runs_its_targets_and_llama_cpp_peers_in_exact_mode_when_asked(monkeypatch):
    """benchmarks/matrix.py --exact: every target it opens and every llama.cpp peer it runs is in exact mode
    (on a bit-invariant build every answer is then plain decoding's, so a row compares the same text);
    without it, neither is. Fails if the flag stopped short of the targets or the peers."""
    from pathlib import Path

    from specdec_gguf.sampling import SamplingParams

    matrix = _benchmark("matrix")
    opened = []

    class Opened(Exception):
        pass

    def open_engine(settings):
        opened.append(settings.exact)
        raise Opened  # (what the case would run is not this test's)

    monkeypatch.setattr(matrix, "open_engine", open_engine)
    for exact in (False, True):
        with pytest.raises(Opened):
            matrix.run_case("gemma", Path("t.gguf"), None, "prompt-lookup", "default", 8, 1, 1, [], exact=exact)
    assert opened == [False, True]

    cases, peers = [], []
    monkeypatch.setattr(matrix, "run_case", lambda *args, exact=False, **kwargs: cases.append(exact) or {})
    monkeypatch.setattr(matrix, "LlamaCppPeer", lambda *args, exact=False, **kwargs: peers.append(exact))
    for exact in (False, True):
        matrix.lookup_rows("gemma", Path("g.gguf"), [("default", 8)], [1], 1, Path("peer"), SamplingParams(),
                           exact=exact)
    assert cases == [False, True]
    assert peers == [False] * len(matrix.NGRAM_MODES) + [True] * len(matrix.NGRAM_MODES)


def test_the_matrix_drafts_gemma_with_its_own_first_blocks(monkeypatch, tmp_path, capsys):
    """matrix.py's gemma-l12-draft case: ``--gemma``'s model drafted by its first GEMMA_DRAFT_BLOCKS blocks
    (benchmarks/layer_draft.py), on the short set at each thread count, llama.cpp's draft-simple given the same
    pair (a tiny 4-block model stands in for Gemma, cut to 1 block). Fails if the case drafted with another
    file, left out a thread count or gave the peer no draft."""
    import gguf

    from specdec_gguf.tiny import write_tiny_model

    matrix = _benchmark("matrix")
    model = write_tiny_model(tmp_path / "model.gguf", n_layers=4)
    cases, peers = [], []

    def run_case(name, target, draft, kind, prompt_set, n, threads, repeats, case_peers, sampling, exact=False):
        blocks = gguf.GGUFReader(str(draft)).fields["llama.block_count"].contents()
        cases.append((name, target, blocks, kind, prompt_set, n, threads, len(case_peers)))
        return {"case": name, "set": prompt_set, "n": n, "threads": threads, "adaptive_vs_plain": {"p": 1.0}}

    monkeypatch.setattr(matrix, "run_case", run_case)
    monkeypatch.setattr(matrix, "LlamaCppPeer", lambda binary, target, mode, draft=None, **kwargs:
                        peers.append((target, mode, draft is not None)))
    monkeypatch.setattr(matrix, "GEMMA_DRAFT_BLOCKS", 1)
    monkeypatch.setattr("sys.argv", ["matrix.py", "--gemma", str(model), "--only", "gemma-l12-draft", "--threads",
                                     "1,2", "-n", "8", "--peer-bin", "peer", "--out", str(tmp_path / "m.json")])
    matrix.main()
    assert cases == [("gemma-l12-draft", model, 1, "draft-model", "short", 8, t, 1) for t in (1, 2)]
    assert peers == [(model, "draft-simple", True)] * 2
    assert "worst adaptive/plain" in capsys.readouterr().out


def test_the_matrix_writes_a_q4_k_m_case_by_requantizing_and_keeps_only_the_pair(monkeypatch, tmp_path):
    """A matrix case in Q4_K_M (tiny-deep-q4k) is written as Q8_0 and requantized: the folder then holds the
    Q4_K_M pair alone and both files decode. Fails if the Q8_0 files were left beside them (a 1 GB case) or the
    pair came out in another type."""
    from gguf_edit import file_type

    from specdec_gguf import SpeculativeDecoder
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.tiny import TinyShape

    matrix = _benchmark("matrix")
    monkeypatch.setitem(matrix.TINY, "tiny-test-q4k", (2, 1, 0.0, TinyShape(n_embd=256, n_head=4, n_ff=512), "q4_k_m"))
    family = matrix.write_case("tiny-test-q4k", tmp_path / "case")
    assert sorted(p.name for p in (tmp_path / "case").rglob("*")) == ["tiny-draft.gguf", "tiny-target.gguf"]
    for path in family:
        assert file_type(path) == 15  # Q4_K_M
    assert "tiny-test-q4k" not in matrix.DEFAULT_TINY and set(matrix.DEFAULT_TINY) <= set(matrix.TINY)
    with LlamaCppEngine(family.target, n_ctx=128, n_threads=1) as target, \
            LlamaCppEngine(family.draft, n_ctx=128, n_threads=1) as draft:
        prompt = target.tokenize("Once upon a time")
        answers = [SpeculativeDecoder(e, None).generate(prompt, 8, ignore_eog=True).tokens for e in (target, draft)]
        # (not equal: Q4_K_M picks Q6_K for some layers by the model's depth, so layer 0 differs between them)
        assert [len(a) for a in answers] == [8, 8]


def test_round_log_says_where_choose_verified_a_copy_in_two_passes(capsys):
    """benchmarks/round_log.py marks a round whose pass choose shortened so that a second pass takes the
    rest, with what one pass would have verified; with the rule off no round is marked. Fails if the
    mark were missing, or printed where one pass was verified."""
    from specdec_gguf.schedule import ScheduleConstants
    from specdec_gguf.simulation import simulate_run, synthetic_traces

    round_log = _benchmark("round_log")
    trace = next(t for t in synthetic_traces() if t.id == "copy-edit-0.15")
    for split in (True, False):
        simulate_run(trace, "big-q8", 128, None, schedule_type=round_log.RoundLog,
                     constants=ScheduleConstants(split_passes=split))
        marked = [line for line in capsys.readouterr().out.splitlines() if "(one pass: " in line]
        assert bool(marked) == split
        for line in marked:  # "verify J (one pass: K, ...": J < K
            verified = int(line.split("verify ")[1].split(" ")[0])
            assert verified < int(line.split("(one pass: ")[1].split(",")[0])


def test_round_log_prints_the_pauses_it_runs_without_asking(capsys):
    """benchmarks/round_log.py prints a line for each pause the decoder runs without asking next_k (a run that
    drafted once and then paused showed one round and nothing else, as if the log had stopped), saying whether
    the guard or the wait for a look made it. Fails if a pause went unprinted or was put down to the wrong one."""
    from specdec_gguf.simulation import simulate_run, synthetic_traces

    round_log = _benchmark("round_log")
    trace = next(t for t in synthetic_traces() if t.id.startswith("open"))
    simulate_run(trace, "tiny-f32", 256, None, drafter="draft-model", draft_ratio=0.3,
                 schedule_type=round_log.RoundLog)
    pauses = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pause: ")]
    assert pauses and all(" plain rounds (" in line for line in pauses)
    schedule = round_log.RoundLog(8)
    schedule.guard._pause = 5
    assert schedule.plain_rounds() == 5
    assert capsys.readouterr().out == "pause: 5 plain rounds (the guard: drafting lost to plain steps lately)\n"


def test_round_log_runs_a_prompt_from_a_prompts_file(tiny_family, tmp_path, monkeypatch, capsys):
    """benchmarks/round_log.py --model --prompts: the prompt with that id comes from the JSONL file (a logged
    adaptive run beside a plain one); an id the file lacks is refused naming the file and the ids it has.
    Fails if --prompts were ignored (the id is in no built-in set) or the refusal named the built-in set."""
    import argparse
    import json

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    round_log = _benchmark("round_log")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "mine", "text": "one two three one two three one two"}) + "\n")
    args = argparse.Namespace(model=tiny_family.target, draft=None, set="default", prompts=prompts, threads=1,
                              exact=False, runs=1, n=8, trace="mine", temp=0.0, seed=0)
    round_log.real_runs(args, None)
    out = capsys.readouterr().out
    assert "run 1, prompt-lookup:" in out and "x plain" in out
    args.trace = "code-edit"  # (in the default set, not in the file)
    with pytest.raises(SystemExit, match=r"no prompt 'code-edit' in .*p\.jsonl; there are: mine"):
        round_log.real_runs(args, None)


def test_judge_runs_each_suite_on_the_recordings_it_finds(tmp_path):
    """benchmarks/judge.py: a suite replays each recording it finds on that model's measured curves (every
    curve a valid policy_sim.py curve), names the command that makes each one it lacks, and every recording a
    suite replays is one that ``record`` makes. Fails if a suite pointed at a recording nobody makes, a draft's cost
    or a curve did not parse, or a missing recording were passed on (policy_suite.py would fail on it)."""
    judge = _benchmark("judge")
    suite = _benchmark("policy_suite")
    for entries in judge.SUITES.values():
        for name, ratio, curve in entries:
            assert name in judge.RECORDINGS
            suite.parse_recorded(f"{name}:{ratio}:{curve}")  # (exits on a ratio, overhead or curve that does not parse)
    (tmp_path / "gemma.jsonl").write_text("")
    recorded, missing = judge.suite_arguments("tuning", tmp_path)
    given = [recorded[i + 1] for i in range(0, len(recorded), 2)]
    assert all(flag == "--recorded" for flag in recorded[::2])
    assert {g.split(":")[0] for g in given} == {str(tmp_path / "gemma.jsonl")}
    curves = {g.split(":", 2)[2].split("=")[0] for g in given}
    # (Q4_K_M's: on both builds on the development host, and on the Intel Xeon model 167.)
    assert curves == {"gemma-epyc2-1t", "gemma-epyc2-2t", "gemma-exact-1t", "gemma-m167-1t", "gemma-m167-2t"}
    assert len(missing) == len({name for name, _, _ in judge.SUITES["tuning"]}) - 1
    assert all("judge.py record --gemma" in note for note in missing)


def test_judge_records_what_is_missing_and_keeps_what_is_there(tmp_path, monkeypatch):
    """``record`` writes each missing recording whole (a tiny pair's answers and teacher-forced draft here),
    and leaves one that is there alone. Fails if a recording were appended to again or left half written."""
    import json

    judge = _benchmark("judge")
    monkeypatch.setattr(judge, "RECORDINGS", {"tiny.jsonl": ("tiny-f32", True, [("short", "tiny-short")])})
    monkeypatch.setattr(judge, "ANSWER_TOKENS", 6)
    judge.record(tmp_path / "unused.gguf", tmp_path, threads=1)
    lines = [json.loads(line) for line in (tmp_path / "tiny.jsonl").read_text().splitlines()]
    assert [line["id"].split(":")[0] for line in lines] == ["tiny-short"] * len(lines) and len(lines) == 5
    assert all(len(line["output"]) == 6 and len(line["draft_agree"]) == len(line["prompt"]) + 6 for line in lines)
    before = (tmp_path / "tiny.jsonl").read_bytes()
    judge.record(tmp_path / "unused.gguf", tmp_path, threads=1)
    assert (tmp_path / "tiny.jsonl").read_bytes() == before
    assert not list(tmp_path.glob("*.partial"))


def test_judge_records_gemma_with_its_first_blocks_as_the_draft(tmp_path, monkeypatch):
    """A recording of "gemma" with a draft: the draft is the model's first GEMMA_DRAFT_BLOCKS blocks
    (benchmarks/layer_draft.py), written once under DIR/models and teacher-forced into the recording (a tiny
    4-block model stands in for Gemma). Fails if no draft were made, or the whole model recorded as its own draft
    (it would agree everywhere: the 1-block cut of a random model does not)."""
    import json

    import gguf

    from specdec_gguf.tiny import write_tiny_model

    judge = _benchmark("judge")
    monkeypatch.setattr(judge, "RECORDINGS", {"g.jsonl": ("gemma", True, [("short", "g-short")])})
    monkeypatch.setattr(judge, "ANSWER_TOKENS", 8)
    monkeypatch.setattr(judge, "GEMMA_DRAFT_BLOCKS", 1)
    model = write_tiny_model(tmp_path / "model.gguf", n_layers=4)
    judge.record(model, tmp_path, threads=1)
    draft = tmp_path / "models" / "model-L1.gguf"
    assert gguf.GGUFReader(str(draft)).fields["llama.block_count"].contents() == 1
    lines = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    agree = [a for line in lines for a in line["draft_agree"][len(line["prompt"]):]]
    assert len(lines) == 5 and len(agree) == 5 * 8 and not all(agree)


def test_judge_verdict_names_the_simulations_whose_worst_trace_fell():
    """judge.verdict: per variant, its geomean over plain against the shipped constants' (over every row of
    every simulation) and the simulations whose worst trace fell by more than WORST_FALL. Fails if a fall
    were missed, a rise or a fall within the tolerance were reported, or the shift were not a geomean."""
    judge = _benchmark("judge")

    def rows(shipped, other):
        return [{"variants": {"shipped": a, "other": b}} for a, b in zip(shipped, other)]

    results = [("falls", rows([1.0, 1.2], [0.95, 1.2])),  # worst 1.0 -> 0.95
               ("rises", rows([0.9, 1.0], [1.0, 1.0])),  # worst 0.9 -> 1.0
               ("within", rows([1.0, 1.1], [0.995, 1.1]))]  # worst 1.0 -> 0.995: within WORST_FALL
    (line,) = judge.verdict(results)
    logs = [math.log(0.95), 0.0, math.log(1.0 / 0.9), 0.0, math.log(0.995), 0.0]
    shift = math.exp(sum(logs[i] + logs[i + 1] for i in (0, 2, 4)) / 2 / 3) - 1.0
    assert line.startswith(f"other: geomean over plain {shift:+.2%} against shipped; worst trace fell in 1 of 3")
    assert "falls: 1.000 -> 0.950" in line and "rises" not in line and "within" not in line
    assert judge.verdict([("only", [{"variants": {"shipped": 1.0}}])]) == []


def test_a_variant_without_fields_is_a_null_arm():
    """ab_constants.py --variant NAME (no fields): the shipped constants under another name, so the arm's
    distance from "shipped" measures the noise. Fails if it were refused or changed a constant, or if a null
    arm could take a reserved name."""
    from specdec_gguf.schedule import ScheduleConstants

    parse_variant = _benchmark("ab_constants").parse_variant
    assert parse_variant("same") == ("same", ScheduleConstants())
    with pytest.raises(SystemExit, match="a name of its own"):
        parse_variant("shipped")


def test_ab_constants_samples_from_its_seed_or_decodes_greedily():
    """ab_constants.py --temp T --seed S: the trials sample at T from seed S (run_trials adds the repeat: the
    arms of a repeat draw alike where their rounds line up); --temp 0 decodes greedily. Fails if the seed were dropped
    (trials would draw differently) or temperature 0 sampled."""
    sampling_for = _benchmark("ab_constants").sampling_for
    params = sampling_for(0.8, 3)
    assert params.temperature == 0.8 and not params.greedy
    assert params.rng().random() == sampling_for(0.8, 3).rng().random()
    assert sampling_for(0.0, 3).greedy
    with pytest.raises(ConfigError, match="temperature"):
        sampling_for(-1.0, 3)


def test_sampled_acceptance_reads_each_positions_chance_from_the_two_rows(tiny_family, tiny_engines):
    """benchmarks/sampled_acceptance.py, teacher-forced: a draft that is the target itself (another engine of
    the same file) is accepted with chance 1 at every answer position, and every drawable token's
    min(1, p/q) is 1; the tiny pair's own draft less (fails if the rows were misaligned, or the chance
    were anything but sum min(p, q)). A bucket that decides the value explains all of its variance, one
    that is the same for every token none."""
    import numpy as np

    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.sampling import SamplingParams

    script = _benchmark("sampled_acceptance")
    target, draft = tiny_engines
    params = SamplingParams(temperature=0.8, seed=1)
    prompt = target.tokenize("Once upon a time there was")
    with LlamaCppEngine(tiny_family.target, n_ctx=512, n_batch=64, n_threads=1) as twin:
        chances, rows = script.answer_chances(target, twin, prompt, 12, params)
    assert len(chances) == 12 and np.allclose(chances, 1.0, atol=1e-4)
    assert all(abs(ratio - 1.0) < 1e-4 for *_, ratio in rows)
    chances, rows = script.answer_chances(target, draft, prompt, 12, params)
    assert len(chances) == 12 and chances.mean() < 0.99 and (chances > 0).all()
    decided = np.array([(b, 0, -1, 1.0, b / 10) for b in range(5)] * 3)
    assert script.explained_by_buckets(decided, 0) == pytest.approx(1.0)
    assert script.explained_by_buckets(decided, 1) == pytest.approx(0.0)


def test_round_overhead_by_round_times_every_round_and_names_what_it_did(tiny_engines, monkeypatch):
    """benchmarks/round_overhead.py --by-round: one time per round and, per adaptive round, what it did, the first
    consulting the drafter and the last ending the generation; plain's rounds are named nothing. Fails if rounds
    were split or merged (the decoder's clock readings per round changed), a round that consulted were taken
    for a pause, or a round that verified drafted tokens (one clock reading fewer) shifted the rounds after it."""
    round_overhead = _benchmark("round_overhead")
    target, _ = tiny_engines
    tokens = target.tokenize("one two three four five six seven eight nine ten")
    for arm in ("plain", "adaptive"):
        decoder = round_overhead._decoder(target, arm)
        target.reset(0)
        rounds, kinds = round_overhead._rounds_timed(decoder, tokens, 24)
        assert len(rounds) == 24 if arm == "plain" else 1 <= len(rounds) <= 24  # (a round commits 1 token or more)
        assert all(seconds > 0 for seconds in rounds)
        if arm == "plain":
            assert kinds == []
        else:
            assert len(kinds) == len(rounds) and kinds[0] == "consulted" and kinds[-1] == "last"
            assert set(kinds) <= set(round_overhead.KINDS)
    # Rounds that verify drafted tokens read the clock once fewer: a fixed-k lookup on a prompt it copies from
    # verifies in most rounds, and each round still gets its own time (a stride of READS read them misaligned).
    from specdec_gguf.decoder import SpeculativeDecoder
    from specdec_gguf.drafters import PromptLookupDrafter
    from specdec_gguf.schedule import FixedSchedule

    passes: list[int] = []  # drafted tokens each of the run's passes verified
    forward = type(target).forward_proposal

    def counting(self, anchor, proposal, **kwargs):
        passes.append(len(proposal.tokens))
        return forward(self, anchor, proposal, **kwargs)

    monkeypatch.setattr(type(target), "forward_proposal", counting)
    decoder = SpeculativeDecoder(target, PromptLookupDrafter(), schedule=FixedSchedule(4))
    target.reset(0)
    rounds, kinds = round_overhead._rounds_timed(decoder, tokens * 3, 24)
    assert any(passes) and len(rounds) == len(kinds) == len(passes)
    assert all(seconds > 0 for seconds in rounds)


def test_flash_attention_times_both_settings_per_prompt_and_says_what_auto_chose(monkeypatch, capsys, tmp_path):
    """benchmarks/flash_attention.py on a tiny family: a row per prompt with its length, each setting's plain and
    adaptive milliseconds, their ratios, and what flash_attn="auto" chose for the target. Fails if a ratio were
    not the quotient of the columns it names, or a prompt's row were missing."""
    import sys

    from specdec_gguf.prompts import PROMPT_SETS

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    bench = _benchmark("flash_attention")
    monkeypatch.setattr(sys, "argv", ["flash_attention.py", "tiny-f32", "--threads", "1", "-n", "4", "--repeats", "1",
                                      "--set", "short"])
    bench.main()
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:-1]}
    assert list(rows) == [pid for pid, _, _ in PROMPT_SETS["short"]]
    for cells in rows.values():
        p_on, p_off, ratio, a_on, a_off, a_ratio, up_on, up_off = (float(c.rstrip("x")) for c in cells[1:])
        assert int(cells[0]) > 0 and min(p_on, p_off, a_on, a_off) > 0
        assert ratio == pytest.approx(p_on / p_off, rel=0.03) and a_ratio == pytest.approx(a_on / a_off, rel=0.03)
        assert up_on == pytest.approx(p_on / a_on, rel=0.03) and up_off == pytest.approx(p_off / a_off, rel=0.03)
    assert lines[-1].startswith('flash_attn="auto" for this target: flash attention ')


def test_timed_context_compares_the_profiles_alone_with_them_priced_per_prompt(monkeypatch, capsys, tmp_path):
    """benchmarks/timed_context.py on a tiny family: what each engine's profile says after a long context, a paired
    ratio per prompt for both adaptive arms and their counts; and its "alone" arm really reads the profiles as
    cached. Fails if a prompt's row were missing or the arms' profiles were not what they are named."""
    import sys

    from specdec_gguf.attention import AttentionChoice
    from specdec_gguf.prompts import PROMPT_SETS

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    bench = _benchmark("timed_context")
    monkeypatch.setattr(sys, "argv", ["timed_context.py", "tiny-f32", "--threads", "1", "-n", "4", "--repeats", "1",
                                      "--set", "short"])
    bench.main()
    out = capsys.readouterr().out
    assert "target: flash attention" in out and "draft: flash attention" in out and "long context alone" in out
    pids = [pid for pid, _, _ in PROMPT_SETS["short"]]
    for arm in ("alone", "shipped"):
        (line,) = [line for line in out.splitlines() if line.split()[:1] == [arm] and "=" in line and "/" not in line]
        ratios = dict(cell.split("=") for cell in line.split()[2:])
        assert list(ratios) == pids and all(float(r) > 0 for r in ratios.values())
    slow = profile_mod.CostProfile({1: 0.01, 5: 0.03})  # (no long-context timing of its own)
    off = AttentionChoice(flash_attn=False, context=256, seconds={"off": {1: 0.02, 5: 0.04}})
    with bench.profiles_alone(True):
        assert profile_mod.with_timed_context(slow, off) is slow
    assert profile_mod.with_timed_context(slow, off).long_context == 256  # (restored on leaving)


def test_a_peer_runs_flash_attention_as_our_target_chose_it(tmp_path):
    """The llama.cpp peer takes flash attention as ``flash_attn="auto"`` chose it for our target (both sides on
    the same attention kernels); None leaves llama.cpp's own choice, and exact mode turns it off whatever was
    chosen. Fails if the peer kept llama.cpp's setting where ours chose another."""
    from specdec_gguf.peers import LlamaCppPeer

    def flag(**kw) -> str | None:
        cmd = LlamaCppPeer(tmp_path / "bin", tmp_path / "model.gguf", "ngram-simple", repack=True, **kw).command("x", 8)
        return cmd[cmd.index("--flash-attn") + 1] if "--flash-attn" in cmd else None

    assert flag(flash_attn=False) == "off" and flag(flash_attn=True) == "on" and flag() is None
    assert flag(flash_attn=True, exact=True) == "off"


def test_round_log_remembered_starts_from_what_the_other_traces_cold_runs_left(monkeypatch, capsys):
    """benchmarks/round_log.py --remembered: the logged run starts from the calibration the other traces' cold
    runs leave in the store (policy_sim.py --remembered's start, where a judge's "remembered" row lost), and
    without it from none. Fails if the flag were ignored (or started the run from nothing)."""
    from specdec_gguf.calibrations import Stored
    from specdec_gguf.simulation import remembered, simulate_run, synthetic_traces

    round_log = _benchmark("round_log")
    traces = synthetic_traces()
    trace = traces[0]
    expected = remembered([simulate_run(t, "big-q8", 64, None, drafter="draft-model", stored=Stored())
                           for t in traces if t.id != trace.id])
    shown = {g: tuple(round(v, 2) for v in c) for g, c in expected.items()}
    for flag, start in ((["--remembered"], f"stored calibrations: {shown}"), ([], "stored calibrations: none")):
        monkeypatch.setattr("sys.argv", ["round_log.py", trace.id, "--curve", "big-q8", "--drafter", "draft-model",
                                         "-n", "64", *flag])
        round_log.main()
        assert start in capsys.readouterr().out.splitlines()[0]


def test_policy_suite_reads_a_drafts_cost_per_token_and_per_proposal():
    """benchmarks/policy_suite.py --recorded FILE:RATIO[+OVERHEAD][:CURVE]: a draft model's settings carry both
    costs (the overhead 0 where none is given), lookup none; a malformed or negative cost exits naming the entry.
    Fails if the overhead were dropped or a bad cost let through."""
    suite = _benchmark("policy_suite")
    path, settings, curves = suite.parse_recorded("t.jsonl:0.07+0.11")
    assert (str(path), settings, curves) == ("t.jsonl", dict(drafter="draft-model", draft_ratio=0.07,
                                                              draft_overhead=0.11), suite.STANDARD_CURVES)
    assert suite.parse_recorded("t.jsonl:0.07:big-q8")[1:] == (dict(drafter="draft-model", draft_ratio=0.07,
                                                                     draft_overhead=0.0), ["big-q8"])
    assert suite.parse_recorded("t.jsonl:lookup")[1] == dict(drafter="prompt-lookup")
    for bad in ("t.jsonl:0.07+x", "t.jsonl:0.07+0.1+0.1", "t.jsonl:0+0.1", "t.jsonl:0.07+-0.1", "t.jsonl"):
        with pytest.raises(SystemExit, match="--recorded 't.jsonl"):
            suite.parse_recorded(bad)


def test_policy_suite_jitter_reports_each_run_over_neighbouring_costs():
    """benchmarks/policy_suite.py --jitter: each run's ratio is the geomean over the curve as measured and the curve
    with its extra cost per token (and a draft model's price) times each factor; the best fixed k stays the measured
    curve's; without factors the rows are policy_sim's own. Fails if a factor were not applied to the curve or to the
    draft's price, or the ratios were not averaged."""
    import math

    from specdec_gguf.simulation import CURVES, synthetic_traces

    suite = _benchmark("policy_suite")
    policy_sim = _benchmark("policy_sim")
    traces = synthetic_traces()[:2]
    settings = dict(drafter="draft-model", draft_ratio=0.1)
    name = suite.perturbed("big-q8", 1.2)
    base, ratios, switch = CURVES["big-q8"]
    assert CURVES[name] == (base, {n: 1.0 + (r - 1.0) * 1.2 for n, r in ratios.items()}, switch)
    plain = policy_sim.simulate_matrix(traces, ["big-q8"], [64], {"shipped": None}, **settings)
    assert suite.jittered_matrix(traces, ["big-q8"], [64], {"shipped": None}, (), **settings) == plain
    runs = [plain] + [policy_sim.simulate_matrix(traces, [suite.perturbed("big-q8", f)], [64], {"shipped": None},
                                                 drafter="draft-model", draft_ratio=0.1 * f) for f in (0.8, 1.2)]
    rows = suite.jittered_matrix(traces, ["big-q8"], [64], {"shipped": None}, (0.8, 1.2), **settings)
    for i, row in enumerate(rows):
        values = [run[i]["variants"]["shipped"] for run in runs]
        assert len(set(values)) > 1  # (the factors moved the runs: the geomean below is of different values)
        assert math.isclose(row["variants"]["shipped"], math.exp(sum(map(math.log, values)) / 3))
        assert row["best_fixed"] == plain[i]["best_fixed"] and row["adaptive"] == row["variants"]["shipped"]


def test_run_curve_reads_each_verify_size_and_the_drafts_line_off_the_rounds():
    """benchmarks/run_curve.py: each size's median verify pass (a size no round verified interpolated between its
    neighbours, the smallest below them; none past the longest pass), a least-squares line through the drafts' seconds against their lengths,
    and a curve entry with the runs' sizes up to 9 and the timed larger ones scaled by the runs' T(9). Fails if a
    size were read off the wrong rounds (verified + 1 tokens a pass), the line were not fitted, or the larger sizes
    were not scaled."""
    run_curve = _benchmark("run_curve")
    policy_sim = _benchmark("policy_sim")
    # (drafted, verified, draft seconds, verify seconds): passes of 2 tokens cost 2 ms, of 5 tokens 5 ms, of 9 tokens
    # 9 ms (one slow outlier: the median ignores it); none of 3; a declined round (verified 0) is not a verify pass.
    rounds = [(n, v, 0.001 + 0.0005 * n, 0.001 * (v + 1)) for n, v in ((1, 1), (2, 1), (4, 4), (8, 8), (8, 8))]
    rounds += [(8, 8, 0.005, 0.030), (1, 0, 0.0015, 0.004)]
    costs = run_curve.verify_costs(rounds)
    assert costs == pytest.approx({2: 0.002, 3: 0.003, 5: 0.005, 9: 0.009})
    assert run_curve.verify_costs([(8, 8, 0.005, 0.009)]) == pytest.approx({2: 0.009, 3: 0.009, 5: 0.009, 9: 0.009})
    overhead, per_token = run_curve.draft_line([r for r in rounds if r[2] != 0.005 and r[1]])
    assert (overhead, per_token) == pytest.approx((0.001, 0.0005))
    entry = run_curve.curve_entry("m", 0.001, costs, {9: 0.0045, 17: 0.006, 33: 0.010, 65: 0.020}, 0.0002)
    assert entry == "m=1.000:2.000,3.000,5.000,9.000,12.000,20.000,40.000:0.200"
    assert policy_sim.parse_curve(entry) == "m"  # (what policy_sim.py and judge.py take)
    with pytest.raises(SystemExit, match="no round verified"):
        run_curve.verify_costs([(1, 0, 0.001, 0.004)])
    # Passes of at most 5 tokens (a run with --k 4): T(9) is not read, not taken for T(5), and no curve is printed.
    short = run_curve.verify_costs([r for r in rounds if r[1] < 8])
    assert short == pytest.approx({2: 0.002, 3: 0.003, 5: 0.005})
    timed = {9: 0.0045, 17: 0.006, 33: 0.010, 65: 0.020}
    assert run_curve.curve_line("m", 0.001, short, timed, 0.0002).startswith("curve: not read (the runs' longest "
                                                                             "verify pass held 5 tokens")
    assert run_curve.curve_line("m", 0.001, costs, timed, 0.0002) == "curve: " + run_curve.curve_entry(
        "m", 0.001, costs, timed, 0.0002)
    assert run_curve.draft_summary(0.0005, 0.001, 0.01, 9).startswith("draft: 0.100+0.050 (")
    assert "below zero" in run_curve.draft_summary(-0.0005, 0.001, 0.01, 9)
    assert "below zero" not in run_curve.draft_summary(0.0, 0.001, 0.01, 9)


def test_run_curve_times_plain_fixed_k_and_adaptive_runs_and_prints_their_entry(tiny_family, capsys, monkeypatch,
                                                                               tmp_path):
    """benchmarks/run_curve.py end to end on the tiny pair: the drafted runs' rounds reach the fit (the fixed-k
    arm's passes verify k + 1 tokens), the curve entry parses as policy_sim.py's, the draft's line reads as
    RATIO+OVERHEAD (its signs are the tiny runs' noise: draft_summary warns of a negative one), and both drafted
    arms report a ratio over plain; the user's cache is left alone. Fails if the recording schedule saw no rounds
    or an entry did not parse."""
    import os
    import re

    run_curve = _benchmark("run_curve")
    policy_sim = _benchmark("policy_sim")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "user"))
    run_curve.main([str(tiny_family.target), "--draft", str(tiny_family.draft), "-t", "1", "-n", "12", "--runs", "2",
                    "--k", "8", "--name", "tiny"])
    out = capsys.readouterr().out
    curve = re.search(r"^curve: (\S+)$", out, re.M)
    draft = re.search(r"^draft: (-?[\d.]+)\+(-?[\d.]+) \(.*; (\d+) proposals\)$", out, re.M)
    assert curve and draft and int(draft.group(3)) > 0
    assert policy_sim.parse_curve(curve.group(1)) == "tiny"
    assert re.search(r"^k = 8: [\d.]+x plain \(", out, re.M) and re.search(r"^adaptive: [\d.]+x plain \(", out, re.M)
    assert not (tmp_path / "user").exists() and os.environ["SPECDEC_CACHE_DIR"] == str(tmp_path / "user")
