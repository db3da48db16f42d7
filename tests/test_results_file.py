"""Batch results are whole lines or nothing, also when the disk fills or the file can't be written."""

from __future__ import annotations

import json
import os

import pytest

from specdec_gguf import SpecDecError
from specdec_gguf.batch import ResultsFile


def test_append_and_completed(tmp_path):
    results = ResultsFile(tmp_path / "r.jsonl")
    assert results.completed() == set()
    results.append({"run": "a", "id": "1", "tokens": [1]})
    results.append({"run": "b", "id": "1", "tokens": [2]})
    assert results.completed() == {("a", "1"), ("b", "1")}


def test_torn_last_line_is_cut_on_resume(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"run": "a", "id": "1"}) + "\n" + '{"run": "a", "id": "2", "te')
    assert ResultsFile(path).completed() == {("a", "1")}
    assert path.read_text().endswith("}\n")


def test_short_write_from_full_disk_leaves_no_torn_line(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    results = ResultsFile(path)
    results.append({"run": "a", "id": "1"})
    before = path.read_bytes()
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:7]))
    with pytest.raises(SpecDecError, match="disk full"):
        results.append({"run": "a", "id": "2"})
    monkeypatch.undo()
    assert path.read_bytes() == before


def test_device_full(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with pytest.raises(SpecDecError, match="No space left on device"):
        ResultsFile(type(tmp_path)("/dev/full")).append({"run": "a", "id": "1"})


def test_unwritable_output(tmp_path):
    with pytest.raises(SpecDecError, match="cannot open the results file"):
        ResultsFile(tmp_path).append({"run": "a", "id": "1"})  # a directory


def test_completed_ignores_non_regular_files():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    assert ResultsFile(type(__import__("pathlib").Path())("/dev/zero")).completed() == set()


def test_summarize_results_pools_runs_and_compares_to_plain():
    from specdec_gguf.batch import summarize_results

    def rec(run, tps, drafted, accepted, generated, passes):
        return {"run": run, "stats": {"generation_throughput": tps, "drafted": drafted, "accepted": accepted,
                                      "generated_tokens": generated, "target_passes": passes}}

    records = [rec("plain", 10.0, 0, 0, 8, 8), rec("plain", 30.0, 0, 0, 8, 8),
               rec("spec", 40.0, 10, 5, 8, 4), rec("spec", 60.0, 6, 3, 8, 4)]
    plain, spec, empty = summarize_results(records, ["plain", "spec", "unused"])
    assert plain.speedup == 1.0 and plain.acceptance_rate is None
    assert spec.acceptance_rate == 8 / 16
    assert spec.tokens_per_target_pass == 16 / 8
    assert spec.median_throughput == 50.0 and spec.speedup == 50.0 / 20.0
    assert empty.prompts == 0 and empty.speedup is None
