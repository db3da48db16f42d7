"""A hypothesis state machine over one engine: any call in any order, including after close().

Used by tests/test_engine_machine.py: in-process for InMemoryEngine, and as
``python tests/engine_machine.py KIND MODEL`` in a child process for LlamaCppEngine and
ProcessEngine, so a segfault or abort is a failed test instead of a dead pytest.

The machine keeps its own record of what the cache should hold. Every call either
succeeds and changes the cache exactly as the protocol says, or raises a SpecDecError
(EngineError once closed) and leaves the cache as it was. Token ids are drawn to include
-1, n_vocab and ids past int32; texts include NUL and lone surrogates.
"""

from __future__ import annotations

import faulthandler
import gc
import sys
from typing import Callable

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from specdec_gguf import EngineError, SpecDecError, SpeculativeDecoder, TextModel
from specdec_gguf.drafters import PromptLookupDrafter


def id_strategy(n_vocab: int) -> st.SearchStrategy[int]:
    bad = [-1, -2, n_vocab, n_vocab + 1, 2**31 - 1, 2**31, -2**31 - 1, 2**40, -2**63, 2**64]
    return st.one_of(st.integers(0, n_vocab - 1), st.integers(0, n_vocab - 1), st.sampled_from(bad))


class EngineMachine(RuleBasedStateMachine):
    """Subclasses set ``make_engine`` (a zero-argument factory)."""

    make_engine: Callable[[], object]

    @initialize()
    def open(self) -> None:
        self.engine = type(self).make_engine()
        self.expected: list[int] = []  # what the cache must hold
        self.closed = False
        self.paused = []  # paused decoder streams
        self.text = isinstance(self.engine, TextModel)
        self.n_vocab, self.n_ctx = self.engine.n_vocab, self.engine.n_ctx

    def teardown(self) -> None:
        if hasattr(self, "engine"):
            self.paused.clear()
            self.engine.close()

    # -- helpers ----------------------------------------------------------------------------
    def _valid(self, tokens: list[int]) -> bool:
        return all(0 <= t < self.n_vocab for t in tokens)

    def _feed(self, call: Callable[[], object], tokens: list[int], needs_one: bool = False):
        """Run a cache-extending call and check it did exactly what the protocol says."""
        ok = (not self.closed and self._valid(tokens) and len(self.expected) + len(tokens) <= self.n_ctx
              and (len(tokens) > 0 or not needs_one))
        try:
            out = call()
        except EngineError:
            assert not ok, f"refused a valid call with {tokens}"
            return None
        except SpecDecError:
            assert not ok and not self.closed, f"wrong error for {tokens} (closed={self.closed})"
            return None
        assert ok, f"accepted an invalid call with {tokens} (closed={self.closed})"
        self.expected.extend(tokens)
        return out

    # -- rules ------------------------------------------------------------------------------
    @rule(data=st.data())
    def reset(self, data) -> None:
        n = data.draw(st.integers(-2, len(self.expected) + 2))
        try:
            self.engine.reset(n)
        except EngineError:
            assert self.closed or not 0 <= n <= len(self.expected)
            return
        assert not self.closed and 0 <= n <= len(self.expected)
        del self.expected[n:]

    @rule(data=st.data(), method=st.sampled_from(["advance", "forward_argmax", "forward_logits"]))
    def forward(self, data, method) -> None:
        tokens = data.draw(st.lists(id_strategy(self.n_vocab), max_size=12))
        out = self._feed(lambda: getattr(self.engine, method)(tokens), tokens)
        if out is None or method == "advance":
            return
        n = len(tokens)
        if method == "forward_argmax":
            assert out.shape == (n,) and all(0 <= int(t) < self.n_vocab for t in out)
        else:
            assert out.shape == (n, self.n_vocab) and np.isfinite(out).all()

    @rule(data=st.data(), method=st.sampled_from(["forward_last_argmax", "forward_last_logits"]))
    def forward_last(self, data, method) -> None:
        tokens = data.draw(st.lists(id_strategy(self.n_vocab), max_size=6))
        out = self._feed(lambda: getattr(self.engine, method)(tokens), tokens, needs_one=True)
        if out is None:
            return
        if method == "forward_last_argmax":
            assert 0 <= int(out) < self.n_vocab
        else:
            assert out.shape == (self.n_vocab,)

    @rule(data=st.data())
    def fill(self, data) -> None:
        """Advance up to (or one past) the end of the context."""
        room = self.n_ctx - len(self.expected)
        n = data.draw(st.integers(max(room - 1, 0), room + 1))
        tokens = [int(t) % self.n_vocab for t in range(n)]
        self._feed(lambda: self.engine.advance(tokens), tokens)

    @rule(data=st.data())
    def is_eog(self, data) -> None:
        token = data.draw(id_strategy(self.n_vocab))
        try:
            answer = self.engine.is_eog(token)
        except EngineError:
            assert self.closed
            return
        assert not self.closed and isinstance(answer, bool)

    @precondition(lambda self: self.text)
    @rule(text=st.text(max_size=20))
    def tokenize(self, text) -> None:
        try:
            tokens = self.engine.tokenize(text)
        except EngineError:
            assert self.closed or any(0xD800 <= ord(c) <= 0xDFFF for c in text)
            return
        assert not self.closed and all(0 <= t < self.n_vocab for t in tokens)

    @precondition(lambda self: self.text)
    @rule(data=st.data())
    def detokenize(self, data) -> None:
        tokens = data.draw(st.lists(id_strategy(self.n_vocab), max_size=6))
        try:
            text = self.engine.detokenize(tokens)
        except EngineError:
            assert self.closed or not self._valid(tokens)
            return
        assert not self.closed and self._valid(tokens) and isinstance(text, str)

    @precondition(lambda self: not self.closed and len(self.expected) + 8 < self.n_ctx)
    @rule(data=st.data())
    def pause_stream(self, data) -> None:
        """Start a generation, take one round, and keep the paused stream."""
        prompt = data.draw(st.lists(st.integers(0, self.n_vocab - 1), min_size=1, max_size=4))
        stream = SpeculativeDecoder(self.engine, PromptLookupDrafter(), num_draft_tokens=3).stream(prompt, 50)
        next(stream)
        self.paused.append(stream)
        self.expected = [int(t) for t in self.engine.tokens]
        assert self.expected[: len(prompt) - 1] == prompt[:-1]

    @precondition(lambda self: self.paused)
    @rule()
    def drop_stream(self) -> None:
        """A paused stream garbage-collected (after close, or after other calls) must not crash or cut the cache."""
        self.paused.pop(0)
        gc.collect()

    @rule()
    def close(self) -> None:
        self.engine.close()
        self.closed = True

    @invariant()
    def cache_matches_record(self) -> None:
        if not hasattr(self, "engine"):
            return
        assert self.engine.n_past == len(self.expected)
        assert [int(t) for t in self.engine.tokens] == self.expected


def run(make_engine: Callable[[], object], max_examples: int, steps: int) -> None:
    """Run the machine over engines from ``make_engine`` (raises on a falsifying example)."""
    machine = type("Machine", (EngineMachine,), {"make_engine": staticmethod(make_engine)})
    machine.TestCase.settings = settings(max_examples=max_examples, stateful_step_count=steps, deadline=None,
                                         suppress_health_check=list(HealthCheck), derandomize=True)
    machine.TestCase("runTest").runTest()


def main(kind: str, model: str, max_examples: int, steps: int) -> None:
    faulthandler.enable()  # a crash prints the Python stack of the call that caused it
    if kind == "llama":
        from specdec_gguf.engines import LlamaCppEngine

        run(lambda: LlamaCppEngine(model, n_ctx=32, n_batch=8), max_examples, steps)
    else:
        from specdec_gguf.engines import ProcessEngine

        run(lambda: ProcessEngine(model, python=sys.executable, n_ctx=32, n_batch=8), max_examples, steps)
    print("machine passed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
