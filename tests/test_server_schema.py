"""Request validation for the server, without a model: what is refused, what is read, and how."""

from __future__ import annotations

import pytest

from specdec_gguf import SamplingParams
from specdec_gguf.server.schema import RequestError, parse_json, parse_request
from specdec_gguf.settings import DrafterSettings

LOOKUP = DrafterSettings(kind="prompt-lookup")


def parse(data, kind="completion", drafter=LOOKUP):
    return parse_request(kind, data, sampling=SamplingParams(), drafter=drafter)


def test_draft_overrides_nested_or_dotted_like_llama_cpp():
    """{"speculative": {...}} and llama.cpp's flat "speculative.n_max" keys both override the draft settings."""
    nested = parse({"prompt": "x", "speculative": {"n_max": 5, "n_min": 2, "adaptive": False}}).drafter
    assert (nested.max_draft_tokens, nested.draft_min, nested.adaptive) == (5, 2, False)
    dotted = parse({"prompt": "x", "speculative.n_max": 3, "speculative.p_min": 0.5}).drafter
    assert (dotted.max_draft_tokens, dotted.p_min) == (3, 0.5)
    assert parse({"prompt": "x"}).drafter is LOOKUP


@pytest.mark.parametrize("data, param", [
    ({"prompt": "x", "speculative": {"n_max": 0}}, "speculative.n_max"),
    ({"prompt": "x", "speculative": {"n_min": 9, "n_max": 4}}, "speculative.n_min"),
    ({"prompt": "x", "speculative": {"p_min": 1.5}}, "speculative.p_min"),
    ({"prompt": "x", "speculative": {"depth": 3}}, "speculative.depth"),
    ({"prompt": "x", "speculative": 4}, "speculative"),
    ({"prompt": "x", "temperature": True}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": "x", "logprobs": 3}, "logprobs"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": [["nested"]]}, "prompt"),
    ({"prompt": [True, 2]}, "prompt"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_refused_values_name_the_field(data, param):
    with pytest.raises(RequestError) as err:
        parse(data)
    assert err.value.status == 400 and err.value.param == param


def test_a_server_without_a_drafter_refuses_draft_overrides():
    with pytest.raises(RequestError, match="without a drafter"):
        parse({"prompt": "x", "speculative": {"n_max": 4}}, drafter=DrafterSettings())


def test_prompts_sampling_and_stream_options():
    assert parse({"prompt": ["one"]}).prompt == "one"
    assert parse({"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    req = parse({"prompt": "x", "temperature": 1, "top_k": 5, "seed": 3, "stop": "END", "stream": True,
                 "stream_options": {"include_usage": True}, "max_completion_tokens": 7, "n": 1})
    assert req.sampling == SamplingParams(temperature=1.0, top_k=5, seed=3)
    assert (req.stop, req.stream, req.include_usage, req.max_tokens) == (("END",), True, True, 7)
    chat = parse({"messages": [{"role": "developer", "content": "s"}, {"role": "user", "content": "u"}]}, "chat")
    assert chat.messages[0] == {"role": "system", "content": "s"}


def test_parse_json_errors():
    with pytest.raises(RequestError, match="not valid JSON"):
        parse_json(b"{")
    with pytest.raises(RequestError, match="JSON object"):
        parse_json(b'"text"')
    assert RequestError("m", param="p").body() == {
        "error": {"message": "m", "type": "invalid_request_error", "param": "p", "code": None}}
