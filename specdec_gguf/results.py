"""The batch results file: append-only JSONL, whole lines only, one writer at a time.

Each (run, prompt) result is one line, written and fsynced as soon as it finishes, so an
interrupted batch loses nothing and ``--resume`` skips what is done. Lines are split on
``"\\n"`` only (a generated text may hold U+2028 or U+0085, which ``str.splitlines`` would
treat as line breaks and so lose the record). A batch holds an exclusive lock on the file
for its lifetime, so two batches never append the same results twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from .errors import ConfigError, SpecDecError
from .textfiles import jsonl_lines

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one batch per results file is then up to the user
    fcntl = None  # type: ignore[assignment]

STATS_KEYS = ("generation_throughput", "drafted", "accepted", "generated_tokens", "target_passes")


def _records(path: Path, data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each line; ConfigError naming the line if one is not a result."""
    for n, line in jsonl_lines(data):
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"{path}:{n}: not UTF-8 text; this is not a results file specdec wrote") from None
        except (json.JSONDecodeError, RecursionError) as err:
            raise ConfigError(f"{path}:{n}: invalid JSON ({getattr(err, 'msg', 'nested too deeply')}); "
                              "fix or remove that line, or choose another -o") from None
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("run", "id")):
            raise ConfigError(f"{path}:{n}: not a result (needs string 'run' and 'id' keys); fix or remove that line")
        yield n, record


class ResultsFile:
    """Append-only JSONL results: whole lines only, each fsynced; ``lock()`` makes this batch the only writer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1  # held open (and locked) between lock() and close()

    def lock(self) -> None:
        """Open the file for appending and hold an exclusive lock on it until ``close()``.

        Raises SpecDecError at once if another batch holds it (never waits).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open()
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise SpecDecError(f"{self.path}: another batch is writing this results file; wait for it "
                                   "to finish, or write to another file with -o") from None
        self._fd = fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing releases the lock
            self._fd = -1

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise SpecDecError(f"{self.path}: cannot open the results file ({err.strerror or err})") from None

    def completed(self) -> set[tuple[str, str]]:
        """(run, id) pairs already written; a torn last line (from a crash) is cut off first."""
        if not self.path.is_file():  # nothing yet (or a device such as /dev/full)
            return set()
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]
            with open(self.path, "r+b") as f:
                f.truncate(len(data))
        return {(record["run"], record["id"]) for _, record in _records(self.path, data)}

    def append(self, record: dict[str, Any]) -> None:
        text = json.dumps(record, ensure_ascii=False)
        try:
            line = (text + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: \u-escapes read back as the same string
            line = (json.dumps(record) + "\n").encode("ascii")
        fd = self._fd if self._fd >= 0 else self._open()
        try:
            written = os.write(fd, line)
            if written != len(line):  # a short write (disk full): undo it so no torn line stays
                os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_END) - written)
                raise SpecDecError(f"{self.path}: disk full; the last result was not written")
            os.fsync(fd)
        except OSError as err:
            raise SpecDecError(f"{self.path}: cannot write results ({err.strerror or err})") from None
        finally:
            if fd != self._fd:
                os.close(fd)


def read_results(path: Path) -> list[dict[str, Any]]:
    """Every result in a results file, for the summary; ConfigError naming the line of one that isn't."""
    if not path.is_file():
        return []
    out = []
    for n, record in _records(path, path.read_bytes()):
        stats = record.get("stats")
        if not isinstance(stats, dict) or not all(
                isinstance(stats.get(k), (int, float)) and not isinstance(stats.get(k), bool) for k in STATS_KEYS):
            raise ConfigError(f"{path}:{n}: result without its stats ({', '.join(STATS_KEYS)}); "
                              "fix or remove that line")
        out.append(record)
    return out
