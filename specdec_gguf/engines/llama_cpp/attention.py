"""Flash attention on or off for a model that runs on the CPU, chosen by timing both (``flash_attn="auto"``).

llama.cpp's own "auto" turns flash attention on wherever the backend has it. On a CPU its kernel for
fewer than 64 query rows (every plain step and verify pass) walks the cached keys one at a time, so
a pass grows dearer with the context much faster than with the matrix products it replaces:
measured on a 2-core Intel Xeon (Q4_K_M, head size 64), a 24-layer d1024 model's plain step after
~350 tokens of context took 25 ms with it and 18 ms without, its 9-token verify pass 80 and 49 ms,
and 64-token answers ran 1.3x-1.6x faster without it wherever the prompt was 200-380 tokens long
(0.83x-0.85x at 32-57 tokens: without it attention runs over the cache padded to 256 cells, a fixed price
at short contexts; the timing's 261 tokens pay for 512); Gemma 3 270M (head size 256, one KV head) ran
0.82x-1.0x without it.
Neither setting wins on every model, so a model that runs on the CPU, its heads narrower than ``WIDE_HEADS``,
times both once, after ``PROBE_CONTEXT`` tokens of context (a chat turn with its template), and turns it off where
that is clearly faster (``OFF_MARGIN``); the choice is cached per model file, threads, batch settings and
llama.cpp build (beside the cost profiles).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import llama_cpp as lc

from ...attention import AttentionChoice
from ...profile import cache_dir, read_cache_file, write_cache_file
from .metadata import meta_str

PROBE_CONTEXT = 256  # tokens of context both settings are timed after
PROBE_SIZES = (1, 5)  # a plain step and a verify pass: the choice minimises their sum ...
# ... where off saves at least this share of it; where the two are closer, llama.cpp's choice (on) stands:
# it wins at short contexts (Gemma 3 270M, on against off, 47.8 / 47.6 ms and 42.3 / 43.5 ms in two timings,
# ran plain steps 5-8% faster with it on after 12-190 tokens).
OFF_MARGIN = 0.9
PROBE_REPEATS = 4  # the fastest of this many timings of each pass (the first also builds its graph)
# Seconds the two contexts' prefills may take, estimated from their first 16 and 64 tokens' pace: a model slower than
# that (weights, not attention, decide its costs) keeps llama.cpp's own choice untimed. At 1.5 a 12-layer d1024 Q8_0
# model at 1 thread (~2.4 s to time) kept it on, and its adaptive answers after 350-380-token prompts ran 0.86x-0.90x
# plain with it (1.39x-1.51x slower plain than with it off).
PROBE_BUDGET = 3.0
# Heads at least this wide keep llama.cpp's choice untimed: its kernel walks the cached keys one head-row at a time,
# which costs little against the rest of a pass where each row is this long (Gemma 3 270M, heads of 256: on 2%-7%
# faster after 256 tokens, a little faster everywhere), and timing it cost a second or two of a first load for the
# same answer. Heads of 128 are still timed: a 16-layer d2048 model's 9-token pass ran 12% / 25% faster with it off
# after 350 / 1000 tokens (its one-token pass within 1% / 15%).
WIDE_HEADS = 256
# ... and only a model this many times over it is remembered as too slow: one nearer it may have been timed in a
# busy moment (a 165 MB model's estimate, 0.5 s of 0.75, read over it once here), so the next load tries again.
SURE_TOO_SLOW = 3.0
FORMAT = 2  # (2: a budget of 3 s: a choice cached as too slow to time under 1.5 s is timed again)


def choose_flash_attn(model: Any, cparams: Any, key: str, token: int, n_ctx: int) -> AttentionChoice:
    """Flash attention on or off for ``model`` with context parameters like ``cparams`` (its threads are the
    timing's), read from the cache under ``key`` or timed now in two short-lived contexts and cached.
    ``n_ctx``: the engine's context (one shorter than the timing's keeps llama.cpp's choice). ``token``: the
    token the timed passes feed."""
    context = PROBE_CONTEXT
    if n_ctx < context + max(PROBE_SIZES):
        # Never that long a context: short ones are where llama.cpp's choice wins (and `specdec inspect`'s
        # 64-token engines neither time nor cache a choice for the engines that run).
        return AttentionChoice(flash_attn=None, reason=f"a context shorter than {context + max(PROBE_SIZES)} tokens")
    width = head_size(model)
    if width >= WIDE_HEADS:
        return AttentionChoice(flash_attn=None, reason=f"attention heads {width} wide, where its kernel keeps up")
    cached = _load(key)
    if cached is not None:
        return cached
    began = time.perf_counter()
    seconds, over = _time_both(model, cparams, context, token)
    flash: bool | None = None  # (too slow to time within the budget, or no context made: llama.cpp's choice)
    if seconds:
        flash = not sum(seconds["off"].values()) < OFF_MARGIN * sum(seconds["on"].values())
    choice = AttentionChoice(flash_attn=flash, seconds=seconds, context=context,
                             probe_seconds=time.perf_counter() - began,
                             reason="" if seconds else f"too slow a model to time within {PROBE_BUDGET} s, or no context")
    if seconds or over >= SURE_TOO_SLOW:  # (a failed context or a near miss of the budget: try again next load)
        write_cache_file(_path_for(key), {"format": FORMAT, "key": key, **choice.as_dict()})
    return choice


def head_size(model: Any) -> int:
    """How wide the model's attention heads are: its key length where the file gives one (Gemma 3: 256 for a
    640-wide model with 4 heads), else the embedding over the heads (0: no heads)."""
    architecture = meta_str(model, "general.architecture")
    width = meta_str(model, f"{architecture}.attention.key_length") if architecture else None
    if width is not None and width.isdigit():
        return int(width)
    heads = lc.llama_model_n_head(model)
    return lc.llama_model_n_embd(model) // heads if heads > 0 else 0


def _time_both(model: Any, cparams: Any, context: int, token: int) -> tuple[dict[str, dict[int, float]], float]:
    """Per setting ("on", "off"), the fastest of ``PROBE_REPEATS`` timings of each ``PROBE_SIZES`` pass after
    ``context`` tokens, each setting in a context of its own, the two timed in turn (a busy moment slows
    both alike); and 0. Empty, and how many times over ``PROBE_BUDGET`` taking in the context would have
    gone (0: llama.cpp could not make a context), where it was not timed."""
    probes: dict[str, _Probe] = {}
    try:
        for name, fa in (("on", lc.LLAMA_FLASH_ATTN_TYPE_ENABLED), ("off", lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)):
            probe = _Probe.open(model, cparams, fa, context)
            if probe is None:
                return {}, 0.0
            probes[name] = probe
            over = probe.take_in(token, PROBE_BUDGET / 2)
            if over:
                return {}, over
        best: dict[str, dict[int, float]] = {name: {} for name in probes}
        for _ in range(PROBE_REPEATS):
            for n in PROBE_SIZES:
                for name, probe in probes.items():
                    best[name][n] = min(best[name].get(n, float("inf")), probe.time(n, token))
        return best, 0.0
    except RuntimeError:
        return {}, 0.0
    finally:
        for probe in probes.values():
            probe.close()


class _Probe:
    """A short-lived llama.cpp context with one flash attention setting, for timing passes after a context."""

    def __init__(self, ctx: Any, batch: Any, context: int) -> None:
        self.ctx, self.batch, self.context = ctx, batch, context
        self.memory = lc.llama_get_memory(ctx)

    @classmethod
    def open(cls, model: Any, cparams: Any, flash_attn: int, context: int) -> _Probe | None:
        """A context like ``cparams`` (threads) with room for ``context`` tokens and the largest pass; None if
        llama.cpp could not make it."""
        params = lc.llama_context_default_params()
        for name in ("n_threads", "n_threads_batch", "no_perf"):
            setattr(params, name, getattr(cparams, name))
        params.n_ctx = params.n_batch = params.n_ubatch = context + max(PROBE_SIZES)
        params.n_seq_max = 1
        params.flash_attn_type = flash_attn
        ctx = lc.llama_init_from_model(model, params)
        return cls(ctx, lc.llama_batch_init(params.n_batch, 0, 1), context) if ctx else None

    def take_in(self, token: int, limit: float) -> float:
        """Fill the context in three passes, each a check of the pace: 16 tokens (4x the limit: a pass that
        short overstates it), to 64 (the limit), then the rest in one batch (as a prompt's prefill). 0 when
        filled; where taking in all of it would take longer than ``limit`` seconds, stopped: how many times
        over the (slackened) limit the estimate went."""
        done, context = 0, self.context
        for upto, slack in ((16, 4.0), (64, 1.0), (context, None)):
            upto = min(upto, context)
            if upto > done:
                took = self._decode(done, upto - done, token)
                if slack is not None and (over := took / (upto - done) * context / (slack * limit)) > 1.0:
                    return over
                done = upto
        return 0.0

    def time(self, n: int, token: int) -> float:
        """Seconds of one pass over ``n`` tokens after the context, every row with logits (as a verify pass)."""
        lc.llama_memory_seq_rm(self.memory, 0, self.context, -1)
        return self._decode(self.context, n, token)

    def _decode(self, start: int, n: int, token: int) -> float:
        batch = self.batch
        batch.n_tokens = n
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = int(start + i >= self.context)
        t0 = time.perf_counter()
        if lc.llama_decode(self.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return time.perf_counter() - t0

    def close(self) -> None:
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)


def _path_for(key: str) -> Path:
    return cache_dir() / f"attention-{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _load(key: str) -> AttentionChoice | None:
    """The cached choice for ``key`` (None: missing, unreadable or another key's)."""
    data = read_cache_file(_path_for(key), key, FORMAT)
    try:
        return AttentionChoice.from_dict(data, from_cache=True) if data is not None else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
