"""Batch runs: several named runs over the same prompts, results appended as JSONL (see results.py)."""

from __future__ import annotations

import json
import signal
import statistics
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from .chat import chat_prompt_tokens, end_of_turn_tokens, load_chat_template, require_template
from .config import BatchConfig, Prompt, RunSettings
from .decoder import SpeculativeDecoder
from .engine import TextModel
from .errors import SpecDecError
from .factory import make_decoder, open_engine
from .results import ResultsFile, read_results  # noqa: F401 - read_results is part of this module's API
from .textgen import stream_text


@dataclass(frozen=True)
class BatchItem:
    run: RunSettings
    prompt: Prompt


class StopFlag:
    """Set by SIGINT/SIGTERM: the batch stops after the prompt in progress; a second signal aborts.

    ``on_first`` is called (in the signal handler) when the first signal arrives, so a
    front-end can say that a second one drops the prompt in progress. The second signal
    raises KeyboardInterrupt and sets ``aborted``: Python loses an exception raised while the
    handler happens to run inside a destructor or a callback, so the batch loop checks
    ``aborted`` between rounds too.
    """

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.requested = False
        self.aborted = False
        self.on_first = on_first
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            self.aborted = True
            raise KeyboardInterrupt  # second signal: drop the prompt in progress
        self.requested = True
        if self.on_first is not None:
            self.on_first()

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class BatchRunner:
    """Loads the models once and runs every pending (run, prompt) pair, prompt-major
    (run A, run B, run A, ...) so runs see the same machine conditions."""

    def __init__(self, config: BatchConfig, *, verbose: bool = False) -> None:
        if config.output.is_dir():
            raise SpecDecError(f"{config.output}: is a directory; give a file path for the results")
        self.config = config
        self.results = ResultsFile(config.output)
        self.results.lock()  # before the models load: a second batch on this file stops at once
        self.in_progress: BatchItem | None = None  # the (run, prompt) being generated, for progress messages
        self.target: TextModel | None = None
        self.draft: TextModel | None = None
        try:
            self.target = open_engine(config.target, verbose=verbose)
            if any(r.drafter.kind == "draft-model" for r in config.runs) and config.draft is not None:
                self.draft = open_engine(config.draft, verbose=verbose)
            self.decoders = {r.name: make_decoder(self.target, r.drafter, self.draft) for r in config.runs}
        except BaseException:
            self.close()
            raise

    def pending(self, resume: bool) -> list[BatchItem]:
        done = self.results.completed() if resume else set()
        return [BatchItem(run, prompt) for prompt in self.config.prompts for run in self.config.runs
                if (run.name, prompt.id) not in done]

    def save_config(self) -> Path:
        """Write the resolved config and exact mode's verdicts beside the results (``<output>.config.json``)."""
        path = self.config.output.with_name(self.config.output.name + ".config.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        verdicts = {role: e.exactness.as_dict() if e is not None and e.exactness is not None else None
                    for role, e in (("target", self.target), ("draft", self.draft))}
        resolved = {**self.config.resolved(), "exactness": verdicts}  # exact mode's self-test, when on
        path.write_text(json.dumps(resolved, indent=2) + "\n", encoding="utf-8")
        return path

    def run(self, items: list[BatchItem], stop: StopFlag,
            on_start: Callable[[BatchItem], None] | None = None) -> Iterator[tuple[BatchItem, dict[str, Any]]]:
        """Run ``items`` in order, appending each result as it finishes; stops early when ``stop`` is set.

        ``on_start`` is called with each item just before it is generated.
        """
        for item in items:
            if stop.requested:
                return
            self.in_progress = item
            if on_start is not None:
                on_start(item)
            record = self.run_one(item, stop)
            self.in_progress = None
            self.results.append(record)
            yield item, record

    def run_one(self, item: BatchItem, stop_flag: StopFlag | None = None) -> dict[str, Any]:
        """Generate one (run, prompt) result; raises KeyboardInterrupt once ``stop_flag`` is aborted."""
        target = self.target
        stop_ids: frozenset[int] = frozenset()
        if self.config.chat:
            formatter = require_template(load_chat_template(target), target)
            prompt_tokens = chat_prompt_tokens(target, formatter.render([{"role": "user", "content": item.prompt.text}]))
            stop_ids = end_of_turn_tokens(formatter, target)
        else:
            prompt_tokens = target.tokenize(item.prompt.text, add_bos=True)
        decoder: SpeculativeDecoder = self.decoders[item.run.name]
        events = []
        for event in stream_text(decoder, target.token_to_piece, prompt_tokens, item.run.max_tokens,
                                 item.run.sampling, stop_token_ids=stop_ids, stop=item.run.stop):
            events.append(event)
            if stop_flag is not None and stop_flag.aborted:
                raise KeyboardInterrupt  # the second signal's own exception was lost (see StopFlag)
        return {"run": item.run.name, "id": item.prompt.id, "text": "".join(e.text for e in events),
                "tokens": [t for e in events for t in e.tokens], "stop_reason": events[-1].stop_reason,
                "stats": events[-1].stats.as_dict()}

    def close(self) -> None:
        for engine in (self.draft, self.target):
            if engine is not None:
                engine.close()
        self.results.close()


@dataclass(frozen=True)
class RunSummary:
    """One run's results over its prompts, for the batch summary table."""

    name: str
    prompts: int
    acceptance_rate: float | None  # None when the run drafted nothing
    tokens_per_target_pass: float | None
    median_throughput: float | None
    speedup: float | None  # median throughput / the plain run's, when there is a plain run


def summarize_results(records: list[dict[str, Any]], run_names: list[str]) -> list[RunSummary]:
    """Per run: pooled acceptance and tokens per pass, median tok/s, speed-up over the plain run."""
    by_run = {name: [r for r in records if r.get("run") == name] for name in run_names}
    medians = {name: statistics.median(r["stats"]["generation_throughput"] for r in rs) if rs else None
               for name, rs in by_run.items()}
    plain = next((name for name, rs in by_run.items() if rs and all(r["stats"]["drafted"] == 0 for r in rs)),
                 None)
    base = medians[plain] if plain else None
    out = []
    for name, rs in by_run.items():
        drafted = sum(r["stats"]["drafted"] for r in rs)
        passes = sum(r["stats"]["target_passes"] for r in rs)
        out.append(RunSummary(
            name=name, prompts=len(rs),
            acceptance_rate=sum(r["stats"]["accepted"] for r in rs) / drafted if drafted else None,
            tokens_per_target_pass=sum(r["stats"]["generated_tokens"] for r in rs) / passes if passes else None,
            median_throughput=medians[name],
            speedup=medians[name] / base if base and medians[name] is not None else None))
    return out
