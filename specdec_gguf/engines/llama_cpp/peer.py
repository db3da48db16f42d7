"""llama-cpp-python's own speculative path, run side by side with ours in `specdec bench`."""

from __future__ import annotations

import os
import time
from typing import Sequence

import llama_cpp as lc

from ...modelfile import validate_gguf
from .backends import extra_buffers_allowed


class PeerPromptLookup:
    """``Llama`` + ``LlamaPromptLookupDecoding``: llama-cpp-python's prompt-lookup speculation.

    Note: llama-cpp-python turns on ``logits_all`` with a draft model, so it keeps
    n_ctx × n_vocab floats; keep ``n_ctx`` modest.
    """

    def __init__(self, model_path: str | os.PathLike[str], *, n_ctx: int = 2048, n_threads: int | None = None,
                 num_pred_tokens: int = 10) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        validate_gguf(model_path)
        # ``Llama`` takes no extra-buffer setting: give its load the same model defaults as our engine's.
        defaults = lc.llama_cpp.llama_model_default_params
        allowed = extra_buffers_allowed()

        def model_defaults() -> lc.llama_model_params:
            params = defaults()
            params.use_extra_bufts = allowed
            return params

        lc.llama_cpp.llama_model_default_params = model_defaults
        try:
            self._llm = lc.Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=n_threads,
                                 n_threads_batch=n_threads,
                                 draft_model=LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens),
                                 verbose=False)
        finally:
            lc.llama_cpp.llama_model_default_params = defaults

    def generate(self, prompt_tokens: Sequence[int], max_tokens: int) -> tuple[list[int], float]:
        """Greedy tokens and generation throughput (tok/s after the first token, prefill excluded)."""
        llm = self._llm
        llm.reset()  # prefill the prompt anew, as each of our cold trials does (benchmark.start_afresh)
        tokens: list[int] = []
        t_first = t_last = 0.0
        for token in llm.generate(list(prompt_tokens), temp=0.0, top_k=1, reset=True):
            now = time.perf_counter()  # end-of-generation tokens are kept, as in our benchmarks
            if not tokens:
                t_first = now
            t_last = now
            tokens.append(int(token))
            if len(tokens) >= max_tokens:
                break
        rate = (len(tokens) - 1) / (t_last - t_first) if len(tokens) > 1 and t_last > t_first else 0.0
        return tokens, rate

    def close(self) -> None:
        self._llm.close()
