"""`specdec serve` as a client sees it: the real server process on a free port, driven by the official
`openai` client and by raw HTTP (httpx), on tiny GGUF models with a ChatML template."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from openai import OpenAI
from typer.testing import CliRunner

from specdec_cli.app import app
from specdec_gguf.tiny import CHATML_TEMPLATE, CHATML_TOKENS, write_tiny_family

KEY = "test-key"
CTX = 2048
PROMPT = "the model is fast and the draft is the model is"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specdec_cli.app", "serve", "-m", str(model), "--port", str(port),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.communicate()[1]}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def stop_server(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    return write_tiny_family(tmp_path_factory.mktemp("serve"), seed=0, chat_template=CHATML_TEMPLATE,
                             special_tokens=CHATML_TOKENS)


@pytest.fixture(scope="module")
def server(family):
    """One server for the module: prompt lookup, 2048-token context, an API key, at most one waiting request."""
    proc, base = start_server(family.target, "--prompt-lookup", "-c", str(CTX), "--api-key", KEY, "--max-queue", "1")
    yield base
    code, err = stop_server(proc)
    assert code == 0, err
    assert "models closed" in err


@pytest.fixture
def client(server) -> OpenAI:
    return OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def cli_json(*args) -> dict:
    result = CliRunner().invoke(app, ["run", *map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny-target.gguf"]
    meta = httpx.get(server + "/v1/models", headers=auth()).json()["data"][0]["meta"]
    assert isinstance(meta["attention"]["flash_attn"], bool)  # flash attention as "auto" chose it at load
    assert httpx.get(server + "/health").json()["status"] == "ok"  # no key needed for health


def test_chat_streaming_and_not_agree_and_carry_stats(client):
    """Greedy chat through the openai client: the streamed deltas add up to the non-streamed message, and
    both carry usage and the speculative object (fails if the final chunk dropped text or stats)."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0)
    text = full.choices[0].message.content
    assert full.choices[0].finish_reason in ("length", "stop") and text
    assert full.usage.completion_tokens <= 24 and full.usage.prompt_tokens > 10
    spec = full.model_extra["speculative"]
    assert spec["drafter"] == "prompt-lookup" and spec["target_passes"] >= 1
    assert {"drafted", "accepted", "acceptance_rate", "tokens_per_target_pass",
            "generation_tokens_per_second"} <= set(spec)

    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].model_extra["speculative"]["target_passes"] >= 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_greedy_output_equals_specdec_run(client, family):
    """The server's greedy text equals `specdec run --json` for the same prompt and settings, for text
    completions and for chat (same template renderer, same system turn)."""
    ran = cli_json("-m", family.target, "--prompt-lookup", "-c", CTX, "-p", PROMPT, "-n", 32)
    served = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0)
    assert served.choices[0].text == ran["text"]
    assert served.usage.completion_tokens == len(ran["tokens"])

    ran = cli_json("-m", family.target, "--prompt-lookup", "-c", CTX, "--system", "be brief", "-p", PROMPT, "-n", 32)
    served = client.chat.completions.create(model="tiny", max_tokens=32, temperature=0, messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}])
    assert served.choices[0].message.content == ran["text"]
    assert served.usage.prompt_tokens == ran["stats"]["prompt_tokens"]


def test_stop_strings_streamed_and_not(client):
    """`stop` cuts the text before the first stop string, streamed or not; nothing of it is sent."""
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0).choices[0].text
    stop = plain[12:15]
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, stop=["qqq", stop])
    assert cut.choices[0].text == plain[:plain.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == plain[:plain.index(stop)]


def test_second_turn_reuses_the_cached_prefix(client):
    """The next turn of a conversation is prefilled only past what the cache already holds."""
    first = [{"role": "user", "content": PROMPT}]
    one = client.chat.completions.create(model="tiny", messages=first, max_tokens=16, temperature=0)
    second = first + [{"role": "assistant", "content": one.choices[0].message.content},
                      {"role": "user", "content": "make it shorter"}]
    two = client.chat.completions.create(model="tiny", messages=second, max_tokens=8, temperature=0)
    assert two.usage.prompt_tokens_details.cached_tokens >= one.usage.prompt_tokens - 1


def test_per_request_draft_settings(client):
    """speculative.n_max / adaptive override the server's draft settings for one request; greedy text is
    unchanged; a value DrafterSettings refuses is a 400 naming the field."""
    base = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
    fixed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0,
                                      extra_body={"speculative": {"n_max": 2, "adaptive": False}})
    spec = fixed.model_extra["speculative"]
    assert spec["n_max"] == 2 and spec["adaptive"] is False
    assert spec["drafted"] <= 2 * spec["target_passes"]
    assert fixed.choices[0].text == base.choices[0].text
    bad = httpx.post(str(client.base_url) + "completions", headers=auth(), json={
        "prompt": "x", "max_tokens": 2, "speculative.n_max": 999})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "speculative.n_max"


def test_prompt_lookup_remembers_earlier_requests(client):
    """Lookup memory is on by default in serve: asked the same thing twice, the second request drafts the
    first one's answer from memory (its own prompt doesn't contain it) and nearly all of it is accepted.
    Fails with --lookup-memory 0 or if each request got a fresh drafter: the second request would then
    draft only from its prompt, like the first."""
    prompt = "list data speed import class value print token draft"
    fixed = {"speculative": {"n_max": 8, "adaptive": False}, "ignore_eos": True}
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=32, temperature=0, extra_body=fixed)
    again = client.completions.create(model="tiny", prompt=prompt, max_tokens=32, temperature=0, extra_body=fixed)
    assert again.choices[0].text == first.choices[0].text
    one, two = first.model_extra["speculative"], again.model_extra["speculative"]
    assert two["lookup_memory_tokens"] > 0
    assert two["accepted"] >= 28 and two["accepted"] > one["accepted"] + 10
    assert two["target_passes"] <= 8


@pytest.mark.parametrize("body, status, needle", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": CTX}).encode(), 400,
     "maximum context length"),
    (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 2}).encode(), 400, "n=2"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "stop": [""]}).encode(), 400, "stop"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client, body, status, needle):
    response = httpx.post(server + "/v1/chat/completions", headers={**auth(), "Content-Type": "application/json"},
                          content=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"] and error["type"] == "invalid_request_error"
    ok = client.completions.create(model="tiny", prompt="the", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens >= 1


def test_api_key_and_unknown_routes(server):
    assert httpx.get(server + "/v1/models").status_code == 401
    wrong = httpx.post(server + "/v1/completions", headers={"Authorization": "Bearer nope"}, json={"prompt": "x"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    missing = httpx.get(server + "/v1/nothing", headers=auth())
    assert missing.status_code == 404 and "error" in missing.json()


def _health(server) -> dict:
    return httpx.get(server + "/health").json()


def _wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class _Stream:
    """A streamed response, the client that holds its connection and the line iterator reading it
    (dropping the iterator closes the connection too, so all three are kept until ``close``)."""

    def __init__(self, http: httpx.Client, response: httpx.Response, lines) -> None:
        self.http, self.response, self.lines = http, response, lines

    def close(self) -> None:
        self.response.close()
        self.http.close()


def _long_stream(server) -> _Stream:
    """Start a streamed completion that would run to the end of the context, and read its first chunk."""
    http = httpx.Client(timeout=120)
    request = http.build_request("POST", server + "/v1/completions", headers=auth(), json={
        "prompt": PROMPT, "max_tokens": CTX - 64, "temperature": 0, "stream": True, "ignore_eos": True})
    response = http.send(request, stream=True)
    lines = response.iter_lines()
    assert next(line for line in lines if line.startswith("data:"))
    return _Stream(http, response, lines)


def test_disconnect_mid_stream_stops_the_generation_and_frees_the_engine(server, client):
    """Closing a stream after its first chunk cancels the generation (counted in /health as cancelled,
    not completed) and the next request is served normally. Fails if the worker ignored the cancel flag:
    the generation would then run to its ~2000-token end and count as completed."""
    before = _health(server)
    response = _long_stream(server)
    response.close()
    _wait_for(lambda: _health(server)["queued"] == 0, "the cancelled generation to end")
    after = _health(server)
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["completed"] == before["completed"]
    ok = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0)
    assert ok.usage.completion_tokens >= 1


def test_full_queue_answers_503_then_recovers(server, client):
    """One generating, one waiting (--max-queue 1): a third request gets 503 with an OpenAI error body;
    once the stream is closed the waiting request completes."""
    running = _long_stream(server)
    waiting: dict = {}
    thread = threading.Thread(target=lambda: waiting.setdefault("r", httpx.post(
        server + "/v1/completions", headers=auth(), json={"prompt": "the", "max_tokens": 3}, timeout=120)))
    thread.start()
    try:
        _wait_for(lambda: _health(server)["queued"] == 2, "the second request to queue")
        busy = httpx.post(server + "/v1/completions", headers=auth(), json={"prompt": "the", "max_tokens": 3})
        assert busy.status_code == 503
        assert busy.json()["error"]["code"] == "queue_full"
    finally:
        running.close()
        thread.join(timeout=120)
    assert waiting["r"].status_code == 200


def test_chat_without_a_template_is_refused_but_completions_work(family, tmp_path):
    """A model file without tokenizer.chat_template: chat gets a 400 that says to use --chat-template;
    text completions are served. SIGTERM during a stream then shuts the server down cleanly."""
    from specdec_gguf.tiny import write_tiny_model

    plain = write_tiny_model(tmp_path / "plain.gguf", n_layers=1)
    proc, base = start_server(plain, "-c", "512")
    try:
        chat = httpx.post(base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and "--chat-template" in chat.json()["error"]["message"]
        done = httpx.post(base + "/v1/completions", json={"prompt": "the model", "max_tokens": 3, "temperature": 0})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] >= 1
        with httpx.stream("POST", base + "/v1/completions", timeout=60, json={
                "prompt": "the model", "max_tokens": 400, "stream": True, "ignore_eos": True}) as stream:
            lines = stream.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]  # the stream ends instead of hanging
        assert "shutting down" in rest[-1] or rest[-1] == "data: [DONE]"
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "stopped by SIGTERM; models closed" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
