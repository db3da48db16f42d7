"""Other implementations run side by side in `specdec bench`: llama.cpp's own speculative example.

``llama-speculative-simple`` (built from the llama.cpp that llama-cpp-python vendors, so
the same kernels) runs as a subprocess per trial; its own report gives the generation
speed. Draft-model speculation and the n-gram modes (``--spec-type``) are both covered.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, EngineError

NGRAM_MODES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")
_SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
# llama.cpp's log now and then loses every line after the draft model loads: the run exits 0 with its
# answer on stdout and no timing line (3 of 120 runs of a tiny pair at 2 threads; a whole matrix cell
# lost its peer). Such a run is run again, this many times at most.
LOST_LOG_RETRIES = 2


def find_llama_speculative(binary: str | os.PathLike[str] | None = None) -> Path:
    """The ``llama-speculative-simple`` binary: ``binary`` if given, else the one on PATH."""
    found = str(binary) if binary else shutil.which("llama-speculative-simple")
    if not found or not Path(found).is_file():
        raise ConfigError(
            f"--peer llama.cpp needs llama-speculative-simple ({binary or 'not on PATH'}): build it from the "
            "llama.cpp that llama-cpp-python vendors (cmake -B build -DLLAMA_BUILD_EXAMPLES=ON && "
            "cmake --build build --target llama-speculative-simple) and pass --peer-bin build/bin/llama-speculative-simple")
    return Path(found)


@dataclass(frozen=True)
class PeerRun:
    """One run of the peer: tokens it generated, its generation speed, drafted and accepted counts, and
    what it printed (the prompt, then the answer's text)."""

    tokens: int
    throughput: float
    drafted: int
    accepted: int
    output: str = ""

    def answer(self, prompt: str) -> str | None:
        """The text printed after ``prompt`` (None: the prompt is not in the output)."""
        at = self.output.find(prompt)
        return None if at < 0 else self.output[at + len(prompt):]


@dataclass(frozen=True)
class LlamaCppPeer:
    """llama.cpp's speculative example with one ``--spec-type`` (``draft-simple`` with a draft model)."""

    binary: Path
    model: Path
    spec_type: str
    draft: Path | None = None
    threads: int | None = None
    draft_max: int = 16
    n_ctx: int = 2048
    # Whether llama.cpp may repack the weights (False: ``--no-repack``). None: as our engines do here
    # (engines/llama_cpp/backends.extra_buffers_allowed: not where the build's AMX kernels may crash),
    # so both sides run the same kernels.
    repack: bool | None = None
    # Run with exact mode's batch-invariant settings (flash attention, weight repacking and the tiled
    # K-quant matmul off), as our exact target runs: the same kernels on both sides, and on a
    # GGML_LLAMAFILE=OFF build the target's own greedy output on both.
    exact: bool = False
    # Flash attention as our target runs it (None: llama.cpp's own choice, on for a CPU), so both sides run
    # the same attention kernels: ``flash_attn="auto"`` turns it off on models where that is clearly faster
    # (engines/llama_cpp/attention.py), and a peer left on would be timed on the slower kernel.
    flash_attn: bool | None = None

    @property
    def name(self) -> str:
        return f"llama.cpp {self.spec_type}"

    def command(self, prompt: str, max_tokens: int) -> list[str]:
        cmd = [str(self.binary), "-m", str(self.model), "-p", prompt, "-n", str(max_tokens), "-c", str(self.n_ctx),
               "--temp", "0", "--top-k", "1", "--spec-type", self.spec_type, "--ignore-eos"]
        if self.draft is not None:  # n-gram modes keep llama.cpp's own tuned sizes
            cmd += ["-md", str(self.draft), "--spec-draft-n-max", str(self.draft_max)]
        repack = False if self.exact else self.repack
        if self.exact or self.flash_attn is not None:
            cmd += ["--flash-attn", "on" if self.flash_attn and not self.exact else "off"]
        if repack is None:
            from .engines.llama_cpp.backends import extra_buffers_allowed  # (llama_cpp loads for a peer only)

            repack = extra_buffers_allowed()
        if not repack:
            cmd.append("--no-repack")
        if self.threads:
            cmd += ["-t", str(self.threads), "-tb", str(self.threads)]
            if self.draft is not None:
                cmd += ["-td", str(self.threads)]
        return cmd

    def environment(self) -> dict[str, str]:
        """The peer's environment: ours, with the tiled K-quant matmul off in exact mode (llama.cpp reads it
        from the environment only)."""
        env = dict(os.environ)
        if self.exact:
            from .engines.llama_cpp.exactness import TILED_ENV  # (llama_cpp loads for a peer only)

            env[TILED_ENV] = "0"
        return env

    def run(self, prompt: str, max_tokens: int, timeout: float = 600.0) -> PeerRun:
        """Run once; a run that exits 0 without its timing line is run again, up to ``LOST_LOG_RETRIES`` times."""
        for attempt in range(LOST_LOG_RETRIES + 1):
            try:
                done = subprocess.run(self.command(prompt, max_tokens), capture_output=True, text=True,
                                      timeout=timeout, errors="replace", env=self.environment())
            except (OSError, subprocess.TimeoutExpired) as err:
                raise EngineError(f"{self.binary}: {err}") from None
            log = done.stdout + done.stderr
            speed = _SPEED.search(log)
            if done.returncode == 0 and speed is not None:
                break
            if done.returncode != 0 or attempt == LOST_LOG_RETRIES:
                tail = (log.strip().splitlines() or ["no output"])[-1]
                raise EngineError(f"{self.name} failed (exit {done.returncode}): {tail}")
        drafted, accepted = _DRAFTED.search(log), _ACCEPT.search(log)
        return PeerRun(tokens=int(speed.group(1)), throughput=float(speed.group(3)),
                       drafted=int(drafted.group(1)) if drafted else 0,
                       accepted=int(accepted.group(1)) if accepted else 0, output=done.stdout)
