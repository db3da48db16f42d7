"""The OpenAI-compatible ASGI app: routes, streaming, errors, the API key.

``POST /v1/chat/completions`` and ``POST /v1/completions`` (streamed as server-sent
events in OpenAI's chunk format, ending with ``data: [DONE]``, or one JSON body),
``GET /v1/models``, ``GET /health``. Each response carries ``usage`` and a
``speculative`` stats object.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..textgen import TextEvent
from .schema import GenerationRequest, RequestError, parse_json, parse_request
from .service import DONE, Job, ModelService, Started, speculative_stats


def create_app(service: ModelService, *, api_key: str | None = None) -> Starlette:
    """The ASGI app serving ``service``; with ``api_key``, /v1 routes need ``Authorization: Bearer <key>``."""

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise RequestError("invalid or missing API key (send 'Authorization: Bearer <key>')", status=401,
                               type="authentication_error", code="invalid_api_key")

    async def generate(request: Request, kind: str) -> Response:
        check_key(request)
        req = parse_request(kind, parse_json(await request.body()), sampling=service.sampling,
                            drafter=service.drafter_settings)
        job = service.submit(req, asyncio.get_running_loop())
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            first = await job.events.get()  # Started, or a RequestError (bad length, tokens, ...)
            if isinstance(first, RequestError):
                raise first
            if first is DONE:  # cancelled while waiting: the client left, or the server is stopping
                raise RequestError("the request was cancelled before it started", status=503,
                                   type="unavailable_error")
            if req.stream:
                watcher.cancel()  # StreamingResponse watches for the disconnect from here on
                return StreamingResponse(_sse(job, first, req, service), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return JSONResponse(await _collect(job, first, req, service))
        except BaseException:
            job.cancel.set()
            raise
        finally:
            if not req.stream:
                watcher.cancel()

    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat")

    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    exactness = service.target.exactness  # exact mode's verdict, fixed at load
    attention = service.target.attention  # flash attention as "auto" chose it at load

    async def models(request: Request) -> Response:
        check_key(request)
        return JSONResponse({"object": "list", "data": [
            {"id": service.model_id, "object": "model", "created": int(time.time()), "owned_by": "specdec-gguf",
             "meta": {"n_ctx": service.target.n_ctx, "n_vocab": service.target.n_vocab,
                      "drafter": service.drafter_settings.kind,
                      "chat_template": service.chat_formatter.name if service.chat_formatter else None,
                      "exactness": exactness.as_dict() if exactness is not None else None,
                      "attention": attention.as_dict() if attention is not None else None}}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": service.model_id, "queued": service.queued,
                             **service.counts})

    async def request_error(request: Request, err: Exception) -> Response:
        assert isinstance(err, RequestError)
        return JSONResponse(err.body(), status_code=err.status)

    async def http_error(request: Request, err: Exception) -> Response:
        assert isinstance(err, HTTPException)
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(err.status_code, "invalid_request_error")
        message = f"{request.method} {request.url.path}: {err.detail}"
        return JSONResponse(RequestError(message, status=err.status_code, type=kind).body(),
                            status_code=err.status_code)

    return Starlette(
        routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                Route("/v1/completions", completions, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/health", health, methods=["GET"])],
        exception_handlers={RequestError: request_error, HTTPException: http_error})


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Set the job's cancel flag when the client goes away (while queued, or during a non-streamed reply)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


def _finish_reason(event: TextEvent) -> str:
    return "length" if event.stop_reason in ("length", "context") else "stop"


def _usage(started: Started, completion_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": started.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": started.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": started.cached_tokens}}


def _envelope(req: GenerationRequest, service: ModelService, ident: str, created: int, chunk: bool) -> dict[str, Any]:
    if req.kind == "chat":
        obj = "chat.completion.chunk" if chunk else "chat.completion"
    else:
        obj = "text_completion"
    return {"id": ident, "object": obj, "created": created, "model": service.model_id}


def _choice(req: GenerationRequest, text: str, finish: str | None, *, chunk: bool, first: bool = False) -> dict:
    if req.kind != "chat":
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if not chunk:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish}
    delta: dict[str, Any] = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}


def _ident(req: GenerationRequest) -> str:
    return ("chatcmpl-" if req.kind == "chat" else "cmpl-") + uuid.uuid4().hex


async def _events(job: Job) -> AsyncIterator[TextEvent]:
    """The job's text events until it is done; a RequestError published mid-way is raised."""
    while True:
        item = await job.events.get()
        if item is DONE:
            return
        if isinstance(item, RequestError):
            raise item
        yield item


async def _collect(job: Job, started: Started, req: GenerationRequest, service: ModelService) -> dict[str, Any]:
    text, n_tokens, last = [], 0, None
    async for event in _events(job):
        text.append(event.text)
        n_tokens += len(event.tokens)
        last = event
    if last is None or last.stop_reason is None:
        raise RequestError("the generation was cancelled (the server is shutting down)", status=503,
                           type="unavailable_error")
    body = _envelope(req, service, _ident(req), int(time.time()), chunk=False)
    body["choices"] = [_choice(req, "".join(text), _finish_reason(last), chunk=False)]
    body["usage"] = _usage(started, n_tokens)
    body["speculative"] = speculative_stats(last, req.drafter, service.lookup_memory)
    return body


def _data(data: dict[str, Any] | str) -> str:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def _sse(job: Job, started: Started, req: GenerationRequest, service: ModelService) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format; the last chunk carries usage and speculative."""
    ident, created = _ident(req), int(time.time())
    head = _envelope(req, service, ident, created, chunk=True)
    n_tokens, first = 0, True
    try:
        if req.kind == "chat":  # OpenAI's first chunk announces the role
            yield _data({**head, "choices": [_choice(req, "", None, chunk=True, first=True)]})
            first = False
        async for event in _events(job):
            n_tokens += len(event.tokens)
            if event.stop_reason is None:
                if event.text:
                    yield _data({**head, "choices": [_choice(req, event.text, None, chunk=True, first=first)]})
                continue
            usage = _usage(started, n_tokens)
            yield _data({**head, "choices": [_choice(req, event.text, _finish_reason(event), chunk=True, first=first)],
                        "usage": usage, "speculative": speculative_stats(event, req.drafter, service.lookup_memory)})
            if req.include_usage:
                yield _data({**head, "choices": [], "usage": usage})
            yield _data("[DONE]")
            return
        yield _data(RequestError("the generation was cancelled (the server is shutting down)", status=503,
                                type="unavailable_error").body())
    except RequestError as err:  # headers are sent: report the error in the stream, as llama.cpp's server does
        yield _data(err.body())
    finally:
        job.cancel.set()  # the client went away (or we are done): the worker stops within one round
