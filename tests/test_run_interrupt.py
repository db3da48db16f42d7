"""Ctrl-C in `specdec run`, at the command level: a child process, interrupted once text has appeared."""

from __future__ import annotations

import re
import signal
import subprocess
import sys


def test_ctrl_c_in_run_exits_130_with_the_partial_text_and_stats(tiny_family):
    """SIGINT after the first generated text reaches stdout (an event, not a delay): exit code 130,
    the text so far on stdout, and the stats of the partial run on stderr with stop reason
    'interrupted'. Fails if Ctrl-C ended the run with a traceback, exit code 1 or no stats
    (e.g. without generate_into's KeyboardInterrupt handling)."""
    n = 2000  # a whole context of tokens: the run is still going when the signal lands
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdec_cli.app", "run", "-m", str(tiny_family.target), "-md", str(tiny_family.draft),
         "-p", "the model is fast and the draft is", "-n", str(n), "-c", "2048", "-t", "1", "--no-live"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(1)  # blocks until generated text is on stdout
    assert first, proc.stderr.read().decode()
    proc.send_signal(signal.SIGINT)
    rest, stderr = proc.communicate(timeout=120)
    err = stderr.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "stop reason: interrupted" in err
    # (", N of them declined a proposal" follows the passes where a round declined its draft)
    generated = re.search(r"tokens per target pass: [\d.]+ \((\d+) tokens in (\d+) passes(, \d+ of them declined "
                          r"a proposal)?\)", err)
    assert generated, err
    assert 0 < int(generated.group(1)) < n  # partial: the run stopped early
    assert len((first + rest).decode("utf-8", errors="replace").strip()) > 0
