"""OpenAI request bodies -> validated generation requests, and the errors that name what was wrong.

Fields this server cannot honour with the value given (``n`` > 1, penalties, tools,
logprobs, ...) are refused with a 400 rather than ignored: ignoring them would silently
change what the client asked for. Unknown fields are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..sampling import SamplingParams
from ..settings import DrafterSettings
from ..stopping import check_stop_strings


class RequestError(Exception):
    """A request the server refuses; becomes an OpenAI-style error body with ``status``."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.type, self.code = message, status, param, type, code

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends it."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenerationRequest:
    """What one request asks for, validated; ``messages`` for chat, ``prompt`` for text completions."""

    kind: str  # "chat" | "completion"
    messages: list[dict[str, str]] | None
    prompt: str | list[int] | None
    max_tokens: int | None
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    drafter: DrafterSettings
    ignore_eos: bool = False  # llama.cpp server's extra field: generate past end-of-generation tokens


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a RequestError saying why not."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RequestError(f"the request body is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _typed(data: dict[str, Any], key: str, kinds: tuple[type, ...], what: str) -> Any:
    value = data.get(key)
    if value is None:
        return None
    number = float in kinds
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds) or (
            number and isinstance(value, float) and not math.isfinite(value)):
        raise RequestError(f"{key}={value!r} must be {what}", param=key)
    return value


def _refuse_unsupported(data: dict[str, Any]) -> None:
    """Fields whose non-default values would change the output in ways this server does not implement."""
    defaults = {"n": (1,), "best_of": (1,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
                "logprobs": (False, 0), "top_logprobs": (0,), "echo": (False,), "suffix": ("",),
                "logit_bias": ({},), "tools": ([],), "functions": ([],)}
    for key, allowed in defaults.items():
        if data.get(key) is not None and data[key] not in allowed:
            raise RequestError(f"{key}={data[key]!r} is not supported by this server (allowed: "
                               f"{allowed[0]!r} or leave it out)", param=key, code="unsupported_parameter")
    fmt = data.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError(f"response_format={fmt!r} is not supported (only {{'type': 'text'}})",
                           param="response_format", code="unsupported_parameter")
    if data.get("tool_choice") not in (None, "none", "auto"):
        raise RequestError("tool_choice is not supported by this server", param="tool_choice",
                           code="unsupported_parameter")


def _sampling(data: dict[str, Any], default: SamplingParams) -> SamplingParams:
    fields = {"temperature": _typed(data, "temperature", (int, float), "a number >= 0"),
              "top_p": _typed(data, "top_p", (int, float), "a number in (0, 1]"),
              "top_k": _typed(data, "top_k", (int,), "an integer >= 0"),
              "min_p": _typed(data, "min_p", (int, float), "a number in [0, 1)"),
              "seed": _typed(data, "seed", (int,), "a non-negative integer")}
    given = {k: (float(v) if k in ("temperature", "top_p", "min_p") else v) for k, v in fields.items() if v is not None}
    try:
        return dataclasses.replace(default, **given)
    except ConfigError as err:
        raise RequestError(str(err), param=str(err).split("=")[0]) from None


# The per-request draft settings, by llama.cpp server's names ("speculative.n_max" or {"speculative": {...}}).
_DRAFT_KEYS = {"n_max": "num_draft_tokens", "n_min": "draft_min", "p_min": "p_min", "adaptive": "adaptive"}


def _drafter(data: dict[str, Any], default: DrafterSettings) -> DrafterSettings:
    given: dict[str, Any] = {}
    nested = data.get("speculative")
    if nested is not None and not isinstance(nested, dict):
        raise RequestError(f"speculative={nested!r} must be an object such as {{'n_max': 8}}", param="speculative")
    for short, field in _DRAFT_KEYS.items():
        for value, param in (((nested or {}).get(short), f"speculative.{short}"),
                             (data.get(f"speculative.{short}"), f"speculative.{short}")):
            if value is not None:
                given[field] = value
                where = param
    unknown = sorted(set(nested or {}) - set(_DRAFT_KEYS))
    if unknown:
        raise RequestError(f"speculative.{unknown[0]} is not a draft setting (allowed: {', '.join(_DRAFT_KEYS)})",
                           param=f"speculative.{unknown[0]}")
    if not given:
        return default
    if default.kind == "none":
        raise RequestError("this server decodes without a drafter; start it with -md or --prompt-lookup to "
                           "use speculative.* settings", param=where)
    try:
        return dataclasses.replace(default, **given)
    except ConfigError as err:
        name = str(err).split("=")[0]
        short = next((s for s, f in _DRAFT_KEYS.items() if f == name), name)
        raise RequestError(f"speculative.{short}: {err}", param=f"speculative.{short}") from None


def parse_request(kind: str, data: dict[str, Any], *, sampling: SamplingParams,
                  drafter: DrafterSettings) -> GenerationRequest:
    """Validate a chat (``kind="chat"``) or text completion body against the server's defaults."""
    from ..chat import normalize_messages
    from ..errors import ChatTemplateError

    _refuse_unsupported(data)
    messages = prompt = None
    if kind == "chat":
        try:
            messages = normalize_messages(data.get("messages"))
        except ChatTemplateError as err:
            raise RequestError(str(err), param="messages") from None
    else:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        valid_ids = isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        if not (isinstance(prompt, str) or valid_ids):
            raise RequestError("prompt must be a string, a list with one string, or a list of token ids",
                               param="prompt")
    max_tokens = _typed(data, "max_completion_tokens", (int,), "an integer >= 1")
    if max_tokens is None:
        max_tokens = _typed(data, "max_tokens", (int,), "an integer >= 1")
    if max_tokens is not None and max_tokens < 1:
        raise RequestError(f"max_tokens={max_tokens} must be an integer >= 1", param="max_tokens")
    try:
        stop = check_stop_strings(data.get("stop"))
    except ConfigError as err:
        raise RequestError(str(err), param="stop") from None
    stream = _typed(data, "stream", (bool,), "true or false") or False
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"stream_options={options!r} must be an object", param="stream_options")
    include_usage = bool((options or {}).get("include_usage", False))
    return GenerationRequest(kind=kind, messages=messages, prompt=prompt, max_tokens=max_tokens,
                             sampling=_sampling(data, sampling), stop=stop, stream=stream,
                             include_usage=include_usage, drafter=_drafter(data, drafter),
                             ignore_eos=_typed(data, "ignore_eos", (bool,), "true or false") or False)
