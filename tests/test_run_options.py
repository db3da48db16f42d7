"""`specdec run` options the README and docs/usage.md advertise: --draft-p-min, and models served by
another interpreter (--target-python / --draft-python)."""

from __future__ import annotations

import json
import os
import sys
import venv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdec_cli.app import app

from identity import assert_matches_plain, plain_reference, strict_identity

runner = CliRunner()
PROMPT = "the model is fast and the draft is"


def run_json(family, *args: str) -> dict:
    result = runner.invoke(app, ["run", "-m", str(family.target), "-p", PROMPT, "-n", "40", "-c", "512", "-t", "1",
                                 "--json", *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_draft_p_min_stops_drafts_early_and_keeps_greedy_output(tiny_family, tiny_engines):
    """--draft-p-min: a draft stops at the first slot where the draft model's top probability falls
    below P, so fewer tokens are drafted (later slots less often than earlier ones) and the greedy
    output is still plain decoding's. Fails if p_min were ignored (the drafted counts would match)."""
    target, _ = tiny_engines
    reference = plain_reference(target, target.tokenize(PROMPT), 40)
    full = run_json(tiny_family, "-md", tiny_family.draft, "-k", "4", "--fixed-k")
    early = run_json(tiny_family, "-md", tiny_family.draft, "-k", "4", "--fixed-k", "--draft-p-min", "0.5")
    assert early["settings"]["drafter"]["p_min"] == 0.5
    assert early["stats"]["drafted"] < full["stats"]["drafted"]
    slots = early["stats"]["per_position_drafted"]
    assert slots[0] > slots[-1]  # some drafts stopped before slot 4
    for out in (full, early):
        assert_matches_plain(out["tokens"], reference, strict=strict_identity(target))


@pytest.fixture(scope="session")
def other_python(tmp_path_factory) -> str:
    """A second interpreter path with the same packages (the same llama-cpp-python build).

    A venv whose site-packages adds this interpreter's package folders (a ``.pth`` running
    ``site.addsitedir``): unlike ``--system-site-packages`` it also sees packages of the venv
    the tests run in (CI installs into a fresh one). Its ``bin/python`` is another path than
    ``sys.executable``, which is what the child engine reports.
    """
    root = tmp_path_factory.mktemp("other-venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)
    (root / "lib" / version / "site-packages" / "parent-packages.pth").write_text(lines)
    python = root / "bin" / "python"
    assert python.exists() and str(python) != sys.executable
    return str(python)


def test_other_interpreter_serves_the_models(tiny_family, other_python):
    """--target-python and --draft-python with a second interpreter: both models run there, the
    child reports that interpreter, and (same build, fixed k, the same passes) the output is the
    in-process output token for token. Fails if the flags were dropped (settings say None) or the
    engine started sys.executable instead (the reported interpreter differs)."""
    from specdec_gguf.engines import ProcessEngine

    local = run_json(tiny_family, "-md", tiny_family.draft, "-k", "3", "--fixed-k")
    remote = run_json(tiny_family, "-md", tiny_family.draft, "-k", "3", "--fixed-k",
                      "--target-python", other_python, "--draft-python", other_python)
    assert remote["settings"]["target"]["python"] == other_python
    assert remote["settings"]["draft"]["python"] == other_python
    assert remote["tokens"] == local["tokens"]
    assert remote["stats"]["accepted"] == local["stats"]["accepted"]

    backends = runner.invoke(app, ["backends", "--json", "--python", other_python])
    assert backends.exit_code == 0, backends.output
    reports = json.loads(backends.stdout)
    assert reports[1]["python"] == other_python
    assert reports[0]["llama_cpp_python"] == reports[1]["llama_cpp_python"]

    with ProcessEngine(tiny_family.target, python=other_python, n_ctx=128, n_threads=1) as engine:
        assert engine.forward_argmax([1, 2]).shape == (2,)
        if Path("/proc/self/cmdline").exists():  # Linux: what the child process really runs
            argv0 = Path(f"/proc/{engine.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            assert argv0 == other_python
