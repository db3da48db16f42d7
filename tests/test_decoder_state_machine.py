"""A hypothesis state machine over decoders: random engines, drafters, k schedules, stop ids and faults.

After every step the invariants of DESIGN.md hold: greedy output equals the target's
own greedy output; both caches hold a prefix of the committed context; a fault
surfaces as EngineError and the same decoder works again right after.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from specdec_gguf import EngineError, SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import InMemoryEngine
from specdec_gguf.schedule import AdaptiveSchedule, FixedSchedule


def reference(engine: InMemoryEngine, prompt: list[int], n: int, stops: set[int]) -> list[int]:
    ctx = list(prompt)
    out: list[int] = []
    while len(out) < n and len(ctx) < engine.n_ctx:
        token = int(engine.logits_for(ctx).argmax())
        if token in stops:
            break
        out.append(token)
        ctx.append(token)
    return out


class DecoderMachine(RuleBasedStateMachine):
    @initialize(vocab=st.integers(3, 24), seed=st.integers(0, 999), noise=st.floats(0, 1.5),
                n_ctx=st.integers(12, 80), use_model=st.booleans(), k=st.integers(1, 8))
    def setup(self, vocab, seed, noise, n_ctx, use_model, k):
        self.target = InMemoryEngine.random(vocab, seed=seed, n_ctx=n_ctx)
        self.draft = self.target.perturbed(noise, seed=seed + 1)
        drafter = AutoregressiveDrafter(self.draft) if use_model else PromptLookupDrafter(max_ngram=2)
        self.decoder = SpeculativeDecoder(self.target, drafter, num_draft_tokens=k, adaptive=False)
        self.vocab = vocab
        self.committed: list[int] = []  # the last successful run's prompt + output

    @rule(k=st.integers(1, 10), adaptive=st.booleans())
    def change_schedule(self, k, adaptive):
        drafter = self.decoder.drafter
        priors = {g: drafter.acceptance_priors(g) for g in (True, False)} if drafter is not None else None
        self.decoder.schedule = AdaptiveSchedule(k, priors=priors) if adaptive else FixedSchedule(k)

    @rule(data=st.data())
    def generate(self, data):
        prompt = data.draw(st.lists(st.integers(0, self.vocab - 1), min_size=1, max_size=8))
        n = data.draw(st.integers(1, 60))
        stops = set(data.draw(st.lists(st.integers(0, self.vocab - 1), max_size=2)))
        result = self.decoder.generate(prompt, n, stop_token_ids=stops)
        expected = reference(self.target, prompt, n, stops)
        assert result.tokens == expected
        assert result.stop_reason in {"length", "context", "stop_token"}
        self.committed = prompt + result.tokens
        assert self.target.n_past == len(self.committed) - 1

    @rule(data=st.data(), which=st.sampled_from(["target", "draft"]), call=st.integers(0, 30))
    def generate_with_fault(self, data, which, call):
        engine = self.target if which == "target" else self.draft
        engine.calls = 0
        engine.fail_at_call = call
        prompt = data.draw(st.lists(st.integers(0, self.vocab - 1), min_size=1, max_size=6))
        try:
            result = self.decoder.generate(prompt, 30)
        except EngineError as err:
            assert "injected fault" in str(err)
            # the target's cache is a prefix of what the clean run commits; the draft's cache is a
            # prefix of the context its drafter follows (this run's, or the last one's if the
            # fault struck before the drafter started)
            clean = prompt + reference(self.target, prompt, 30, set())
            assert list(self.target.tokens) == clean[: self.target.n_past]
            drafter = self.decoder.drafter
            if isinstance(drafter, AutoregressiveDrafter):
                assert list(self.draft.tokens) == list(drafter.cache_view[: self.draft.n_past])
                assert self.draft.n_past <= max(len(drafter.cache_view) - 1, 0)
        else:
            assert result.tokens == reference(self.target, prompt, 30, set())
        finally:
            engine.fail_at_call = None

    @invariant()
    def caches_within_context(self):
        assert self.target.n_past <= self.target.n_ctx
        assert self.draft.n_past <= self.draft.n_ctx


DecoderMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=12, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])
TestDecoderMachine = DecoderMachine.TestCase
