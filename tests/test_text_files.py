"""Configs, prompt files, stdin and results files of any content: a result or one located error (issue 14)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_gguf import ConfigError, SpecDecError
from specdec_gguf.config import load_batch_config, parse_batch_config, read_prompts_jsonl
from specdec_gguf.results import ResultsFile, read_results

# Characters str.splitlines() breaks at that may sit unescaped inside a JSON string.
LINE_BREAKERS = ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]


def cli(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec_cli.app", *args], input=stdin, capture_output=True,
                          timeout=300, cwd=cwd)


# -- JSONL: split on "\n" only ---------------------------------------------------------------------------
def test_prompt_file_lines_may_hold_unicode_line_separators(tmp_path):
    """Fails with str.splitlines: a U+2028 inside a JSON string split the record ("invalid JSON")."""
    file = tmp_path / "p.jsonl"
    lines = [json.dumps({"id": f"p{i}", "text": f"a{c}b"}, ensure_ascii=False) for i, c in enumerate(LINE_BREAKERS)]
    file.write_text("\n".join(lines) + "\r\n", encoding="utf-8")
    prompts = read_prompts_jsonl(file, "prompts_file")
    assert [p.text for p in prompts] == [f"a{c}b" for c in LINE_BREAKERS]


def test_results_with_line_separators_are_seen_on_resume(tmp_path):
    """A generated text holding U+2028 was written raw (ensure_ascii=False) and then split by splitlines, so
    --resume saw no result and ran the prompt again: duplicates. Fails on the old completed()."""
    results = ResultsFile(tmp_path / "r.jsonl")
    for i, c in enumerate(LINE_BREAKERS):
        results.append({"run": "a", "id": f"p{i}", "text": f"x{c}y"})
    assert results.completed() == {("a", f"p{i}") for i in range(len(LINE_BREAKERS))}


def test_an_id_that_cannot_be_encoded_is_refused_at_load_and_survives_the_results_file(tmp_path):
    """A JSON prompt id "\\udc80" (a lone surrogate) used to crash the batch's first write; the config now
    refuses it, and a results line with one still reads back as the same id (no duplicate on resume)."""
    file = tmp_path / "p.jsonl"
    file.write_text('{"id": "ok", "text": "x"}\n{"id": "\\udc80", "text": "y"}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl:2: id: '\\udc80' at character 0 is not valid Unicode"):
        read_prompts_jsonl(file, "prompts_file")
    results = ResultsFile(tmp_path / "r.jsonl")
    results.append({"run": "a", "id": "\udc80", "text": "t"})
    assert results.completed() == {("a", "\udc80")}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.one_of(
    st.binary(max_size=200),
    st.lists(st.one_of(st.binary(max_size=30), st.sampled_from([
        b'{"id": "a", "text": "b"}', b'{"id": 1, "text": "b"}', b'{"id": "a"}', b"[1]", b'"x"', b"{",
        b'{"id": "\\ud800", "text": "b"}', b'{"id": "a", "text": "\xff"}', b"\xef\xbb\xbf{}", b"[" * 5000,
        '{"id": "c", "text": "\u2028"}'.encode(), b'{"id": "a", "text": "b", "x": 1}'])), max_size=6).map(b"\n".join)))
def test_prompt_files_of_any_bytes_give_prompts_or_one_located_error(tmp_path_factory, data):
    file = tmp_path_factory.mktemp("p") / "p.jsonl"
    file.write_bytes(data)
    try:
        prompts = read_prompts_jsonl(file, "prompts_file")
    except ConfigError as err:
        assert str(err).startswith(f"{file}:") and "\n" not in str(err)
    else:
        assert all(isinstance(p.id, str) and isinstance(p.text, str) for p in prompts)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.lists(st.one_of(st.binary(max_size=30), st.sampled_from([
    b'{"run": "a", "id": "1"}', b'{"run": 1, "id": "1"}', b"[]", b"{", b"\xff", b'{"run": "a", "id": "1", "stats": 3}'])),
    max_size=5).map(b"\n".join))
def test_results_files_of_any_bytes_give_results_or_one_located_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("r") / "r.jsonl"
    path.write_bytes(data)
    for read in (lambda: ResultsFile(path).completed(), lambda: read_results(path)):
        try:
            read()
        except ConfigError as err:
            assert str(err).startswith(f"{path}:") and "\n" not in str(err)


# -- configs: any TOML value in any place -----------------------------------------------------------------
SCALARS = st.one_of(st.integers(-2**64, 2**64), st.floats(), st.booleans(), st.text(max_size=6),
                    st.sampled_from(["\udc80", "a\0b", "", "none", "draft-model", "prompt-lookup", "m.gguf"]),
                    st.datetimes(min_value=datetime(1, 1, 1)))
VALUES = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                      st.dictionaries(st.text(max_size=5), kids, max_size=3)),
                      max_leaves=8)
# Mostly valid values (so validation gets past the first key), now and then anything at all.
VALID = {"n_ctx": 64, "n_batch": 8, "n_threads": 1, "n_gpu_layers": 0, "tensor_split": [1.0], "devices": ["CPU"],
         "python": "python3", "rollback": "auto", "kind": "prompt-lookup", "num_draft_tokens": 4, "draft_min": 0,
         "adaptive": True, "p_min": 0.0, "ngram_max": 3, "ngram_min": 1, "temperature": 0.5, "top_k": 0,
         "top_p": 0.9, "min_p": 0.0, "seed": 1, "max_tokens": 8, "chat": False, "stop": ["x"], "output": "o.jsonl",
         "name": "r", "id": "p", "text": "t", "prompts_file": "missing.jsonl"}
ENGINE = ["n_ctx", "n_batch", "n_threads", "n_gpu_layers", "tensor_split", "devices", "python", "rollback"]
DRAFTER = ["kind", "num_draft_tokens", "draft_min", "adaptive", "p_min", "ngram_max", "ngram_min"]
SAMPLING = ["temperature", "top_k", "top_p", "min_p", "seed"]


def value(key: str) -> st.SearchStrategy:
    return st.one_of(st.just(VALID[key]), st.just(VALID[key]), st.just(VALID[key]), VALUES)


def table(keys: list[str], required: dict | None = None) -> st.SearchStrategy:
    fixed = st.fixed_dictionaries(required or {}, optional={k: value(k) for k in keys})
    return st.one_of(fixed, fixed, fixed, VALUES)


def tables(keys: list[str], required: dict | None = None) -> st.SearchStrategy:
    listed = st.lists(table(keys, required), min_size=1, max_size=3)
    return st.one_of(listed, listed, listed, VALUES)


CONFIGS = st.fixed_dictionaries({"target": table(ENGINE, {"model": st.just("m.gguf")})}, optional={
    "draft": table(ENGINE, {"model": st.just("d.gguf")}), "drafter": table(DRAFTER), "sampling": table(SAMPLING),
    "runs": tables(DRAFTER + ["max_tokens", "stop"], {"name": st.text(max_size=2), "sampling": table(SAMPLING)}),
    "prompts": tables([], {"id": value("id"), "text": value("text")}),
    **{k: value(k) for k in ("prompts_file", "output", "max_tokens", "chat", "stop")}, "extra": VALUES,
})


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=CONFIGS, need_prompts=st.booleans())
def test_config_values_of_any_type_give_a_config_or_one_located_error(tmp_path_factory, data, need_prompts):
    """Fails with a TypeError/AttributeError traceback on shapes like sampling = "hot", drafter = [1], runs = 3,
    prompts = "x", a run's sampling = 1, or a path holding NUL."""
    path = tmp_path_factory.mktemp("c") / "c.toml"
    try:
        parse_batch_config(data, path, require_prompts=need_prompts)
    except ConfigError as err:
        assert str(err).startswith(str(path)) and "\n" not in str(err)


@pytest.mark.parametrize("toml, message", [
    ('sampling = "hot"', "sampling = 'hot' must be a table"),
    ("drafter = [1]", r"drafter = \[1\] must be a table"),
    ("runs = 3", "runs = 3 must be an array of tables"),
    ('prompts = "x"', "prompts = 'x' must be an array of tables"),
    ('[[runs]]\nname = "a"\nsampling = 1', r"\[\[runs\]\] #1: sampling = 1 must be a table"),
    ('[[runs]]\nname = "a"\nmax_tokens = "many"', r"\[\[runs\]\] #1: max_tokens = 'many' must be an integer >= 1"),
    ('output = "a\\u0000b"', "output = 'a\\\\x00b' must be a non-empty path string"),
])
def test_config_shapes_name_the_file_and_key(tmp_path, toml, message):
    path = tmp_path / "c.toml"
    path.write_text(f'{toml}\n[target]\nmodel = "m.gguf"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=f"{path}: {message}"):
        load_batch_config(path, require_prompts=False)


def test_config_in_utf16_or_with_bad_bytes(tmp_path):
    """Fails on the old loader with a UnicodeDecodeError traceback (tomllib decodes the bytes itself)."""
    path = tmp_path / "c.toml"
    path.write_text('[target]\nmodel = "m.gguf"\n', encoding="utf-16")
    with pytest.raises(ConfigError, match=f"{path}: the file is UTF-16 text; save it as UTF-8"):
        load_batch_config(path, require_prompts=False)
    path.write_bytes(b'[target]\nmodel = "m\xe9.gguf"\n')
    with pytest.raises(ConfigError, match=f"{path}:2: not UTF-8 text \\(byte 0xe9 at column 11\\)"):
        load_batch_config(path, require_prompts=False)


# -- the command line: one line, never a traceback -----------------------------------------------------
def test_invalid_utf8_prompt_on_stdin_and_in_a_file(tiny_family, tmp_path):
    """Fails with a UnicodeDecodeError traceback on the old read_prompt."""
    bad = b"the model \xff\xfe is\n"
    done = cli("run", "-m", str(tiny_family.target), "-p", "-", "-n", "2", "--no-live", stdin=bad)
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert b"error: stdin:1: not UTF-8 text (byte 0xff at column 11)" in done.stderr
    file = tmp_path / "prompt.txt"
    file.write_bytes(b"ok\n" + bad)
    done = cli("run", "-m", str(tiny_family.target), "-f", str(file), "-n", "2", "--no-live")
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert f"error: --prompt-file {file}:2: not UTF-8 text".encode() in done.stderr


def _batch_config(tmp_path: Path, family) -> Path:
    config = tmp_path / "b.toml"
    config.write_text(f'output = "out.jsonl"\nmax_tokens = 4\n[target]\nmodel = "{family.target}"\nn_ctx = 128\n'
                      '[[prompts]]\nid = "a"\ntext = "the model"\n', encoding="utf-8")
    return config


def test_a_second_batch_on_the_same_results_file_is_refused(tiny_family, tmp_path):
    """Fails without the lock: the second batch appended the same results again."""
    config = _batch_config(tmp_path, tiny_family)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from specdec_gguf.results import ResultsFile\n"
        f"r = ResultsFile(Path({str(tmp_path / 'out.jsonl')!r})); r.lock(); print('locked', flush=True); "
        "time.sleep(120)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        done = cli("batch", str(config), "--resume")
        assert done.returncode == 1 and b"Traceback" not in done.stderr
        assert b"another batch is writing this results file" in done.stderr
    finally:
        holder.kill()
        holder.wait()
    first, second = ResultsFile(tmp_path / "x.jsonl"), ResultsFile(tmp_path / "x.jsonl")
    first.lock()
    with pytest.raises(SpecDecError, match="another batch is writing"):
        second.lock()
    first.close()
    second.lock()  # released with the first
    second.close()


def test_resume_over_an_invalid_results_line_names_it(tiny_family, tmp_path):
    config = _batch_config(tmp_path, tiny_family)
    (tmp_path / "out.jsonl").write_text('{"run": "default", "id": "x"}\nnot json\n')
    done = cli("batch", str(config), "--resume")
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert f"{tmp_path / 'out.jsonl'}:2: invalid JSON".encode() in done.stderr
