"""One model behind a bounded queue: generations run one at a time in a worker thread.

Every engine call (tokenize, generate) happens on the one worker thread, so engines that
are not thread-safe (llama.cpp contexts, a ProcessEngine's pipe) are only ever driven by
it. The event loop hands a :class:`Job` over and reads its events from an asyncio queue.
The drafter and one decoder per draft setting persist across requests, so adaptive
drafting keeps what it learned, and the target's cache (its record in ``engine.tokens``)
lets the next turn of a conversation reuse the prefix it shares with the last request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..chat import ChatFormatter, chat_prompt_tokens, end_of_turn_tokens, require_template
from ..decoder import SpeculativeDecoder
from ..drafters import AutoregressiveDrafter
from ..engine import TextModel, reusable_prefix
from ..errors import ConfigError, ContextOverflowError, SpecDecError
from ..factory import make_drafter
from ..sampling import SamplingParams
from ..settings import DrafterSettings
from ..textgen import TextEvent, stream_text
from .schema import GenerationRequest, RequestError

log = logging.getLogger("specdec.server")
_MAX_DECODERS = 8  # distinct per-request draft settings kept warm at once


@dataclass(frozen=True)
class Started:
    """The prompt fitted and generation begins: its length, and how much of it the cache already held."""

    prompt_tokens: int
    cached_tokens: int
    max_tokens: int


DONE = object()  # the last item a job publishes


class Job:
    """One queued generation: its request, a cancel flag the worker checks between rounds, its events."""

    def __init__(self, request: GenerationRequest, prompt: str | list[int], loop: asyncio.AbstractEventLoop) -> None:
        self.request, self.prompt = request, prompt
        self.cancel = threading.Event()
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self._loop = loop

    def publish(self, item: Any) -> None:
        """Hand an event to the event loop (from the worker thread)."""
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the loop is gone (shutdown): nobody is listening any more
            self.cancel.set()


class ModelService:
    """A loaded target (and draft model) serving one generation at a time, at most ``max_queue`` waiting."""

    def __init__(self, target: TextModel, drafter: DrafterSettings, *, draft: TextModel | None = None,
                 model_id: str, chat_formatter: ChatFormatter | None = None,
                 sampling: SamplingParams = SamplingParams(), max_tokens: int | None = None,
                 max_queue: int = 16, lookup_memory: int = 0, profile_cache: bool = True) -> None:
        if not isinstance(max_queue, int) or max_queue < 0:
            raise ConfigError(f"max_queue={max_queue!r} must be an integer >= 0")
        self.target, self.draft, self.model_id = target, draft, model_id
        self.drafter_settings, self.sampling, self.max_tokens = drafter, sampling, max_tokens
        self.max_queue = max_queue
        self.chat_formatter = chat_formatter
        self.end_of_turn = end_of_turn_tokens(chat_formatter, target) if chat_formatter else frozenset()
        if lookup_memory and drafter.kind != "prompt-lookup":
            raise ConfigError(f"lookup_memory={lookup_memory} needs the prompt-lookup drafter (--prompt-lookup)")
        self.lookup_memory = lookup_memory
        self.profile_cache = profile_cache
        # One drafter for every request: prompt lookup's memory of earlier requests lives in it.
        self.drafter = make_drafter(drafter, draft, memory_tokens=lookup_memory)
        self._decoders: OrderedDict[tuple, SpeculativeDecoder] = OrderedDict()
        self._decoder_for(drafter)  # checks the draft's vocabulary now, not on the first request
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-generate")
        self._jobs: set[Job] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.counts = {"completed": 0, "cancelled": 0, "failed": 0}  # generations, for /health

    # -- the event loop's side ------------------------------------------------------------------
    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Job:
        """Queue a generation; a RequestError (503) when the queue is full or the server is closing."""
        prompt = self._prompt(request)
        with self._lock:
            if self._closed:
                raise RequestError("the server is shutting down", status=503, type="unavailable_error")
            if len(self._jobs) > self.max_queue:
                raise RequestError(f"the server is busy: one generation running and {self.max_queue} waiting; "
                                   f"retry later", status=503, type="unavailable_error", code="queue_full")
            job = Job(request, prompt, loop)
            self._jobs.add(job)
        self._executor.submit(self._run, job)
        return job

    @property
    def queued(self) -> int:
        """Generations running or waiting."""
        with self._lock:
            return len(self._jobs)

    def cancel_all(self) -> None:
        """Stop every generation within one round and refuse new ones (shutdown)."""
        with self._lock:
            self._closed = True
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel.set()

    def close(self) -> None:
        """Cancel what runs, wait for the worker to finish; the caller closes the engines afterwards."""
        self.cancel_all()
        self._executor.shutdown(wait=True, cancel_futures=False)

    def _prompt(self, request: GenerationRequest) -> str | list[int]:
        """The prompt text (chat: rendered here, a pure function of the messages) or token ids."""
        if request.kind != "chat":
            return request.prompt  # type: ignore[return-value]
        try:
            formatter = require_template(self.chat_formatter, self.target)
            return formatter.render(request.messages or [])
        except ConfigError as err:
            raise RequestError(str(err), param="messages") from None

    # -- the worker thread ----------------------------------------------------------------------
    def _run(self, job: Job) -> None:
        outcome = "cancelled"
        try:
            if not job.cancel.is_set():
                outcome = self._generate(job)
        except RequestError as err:
            outcome = "failed"
            job.publish(err)
        except (ConfigError, ContextOverflowError) as err:
            outcome = "failed"
            job.publish(RequestError(str(err)))
        except SpecDecError as err:
            outcome = "failed"
            log.error("generation failed: %s", err)
            job.publish(RequestError(f"generation failed: {err}", status=500, type="server_error"))
        except Exception as err:  # a bug: keep serving, tell the client, log the traceback
            outcome = "failed"
            log.exception("generation failed")
            job.publish(RequestError(f"internal error: {type(err).__name__}: {err}", status=500, type="server_error"))
        finally:
            self.counts[outcome] += 1
            with self._lock:
                self._jobs.discard(job)
            job.publish(DONE)

    def _generate(self, job: Job) -> str:
        """Run one generation; "completed" if it reached a stop, "cancelled" if told to stop first."""
        request, target = job.request, self.target
        if isinstance(job.prompt, list):
            tokens = list(job.prompt)
            bad = next((t for t in tokens if not 0 <= t < target.n_vocab), None)
            if bad is not None:
                raise RequestError(f"prompt token id {bad} is outside the vocabulary [0, {target.n_vocab})",
                                   param="prompt")
        elif request.kind == "chat":
            tokens = chat_prompt_tokens(target, job.prompt)
        else:
            tokens = target.tokenize(job.prompt, add_bos=True)
        max_tokens = self._token_limit(len(tokens), request.max_tokens)
        job.publish(Started(len(tokens), reusable_prefix(target, tokens[:-1]), max_tokens))
        decoder = self._decoder_for(request.drafter)
        if isinstance(self.drafter, AutoregressiveDrafter):
            self.drafter.p_min = request.drafter.p_min  # read by each proposal; set per request
        events = stream_text(decoder, target.token_to_piece, tokens, max_tokens, request.sampling,
                             stop_token_ids=self.end_of_turn if request.kind == "chat" and not request.ignore_eos else (),
                             stop=request.stop, ignore_eog=request.ignore_eos)
        try:
            for event in events:
                if event.stop_reason is not None:
                    job.publish(dataclasses.replace(event, stats=event.stats.copy()))
                    return "completed"
                job.publish(event)
                if job.cancel.is_set():
                    return "cancelled"  # the client went away or the server stops: free the engine now
        finally:
            events.close()
        return "cancelled"

    def _token_limit(self, n_prompt: int, asked: int | None) -> int:
        n_ctx = self.target.n_ctx
        if n_prompt >= n_ctx or (asked is not None and n_prompt + asked > n_ctx):
            total = n_prompt + (asked or 1)
            raise RequestError(
                f"this model's maximum context length is {n_ctx} tokens; you requested {total} tokens "
                f"({n_prompt} in the prompt, {asked or 1} in the completion); shorten the prompt or max_tokens",
                param="max_tokens" if n_prompt < n_ctx else "messages", code="context_length_exceeded")
        room = n_ctx - n_prompt
        if asked is not None:
            return asked
        return min(self.max_tokens, room) if self.max_tokens is not None else room

    def _decoder_for(self, settings: DrafterSettings) -> SpeculativeDecoder:
        """The persistent decoder for these draft settings (sharing the one drafter)."""
        key = (settings.max_draft_tokens, settings.adaptive, settings.draft_min)
        decoder = self._decoders.get(key)
        if decoder is None:
            decoder = SpeculativeDecoder(self.target, self.drafter, num_draft_tokens=settings.max_draft_tokens,
                                         adaptive=settings.adaptive, draft_min=settings.draft_min,
                                         profile_cache=self.profile_cache)
            self._decoders[key] = decoder
            while len(self._decoders) > _MAX_DECODERS:
                self._decoders.popitem(last=False)
        self._decoders.move_to_end(key)
        return decoder


def speculative_stats(event: TextEvent, settings: DrafterSettings, lookup_memory: int = 0) -> dict[str, Any]:
    """The ``speculative`` object every response carries."""
    stats = event.stats
    return {
        "drafter": settings.kind,
        "lookup_memory_tokens": lookup_memory,
        "n_max": settings.max_draft_tokens if settings.kind != "none" else 0,
        "adaptive": settings.adaptive,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate,
        "target_passes": stats.target_passes,
        "generated_tokens": stats.generated_tokens,
        "tokens_per_target_pass": stats.tokens_per_target_pass,
        "generation_tokens_per_second": stats.generation_throughput,
        "prefill_seconds": stats.prefill_seconds,
        "generation_seconds": stats.generation_seconds,
    }
