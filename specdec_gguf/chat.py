"""Chat templates: turn a conversation into the prompt text a model was trained on.

The GGUF's own ``tokenizer.chat_template`` (Jinja) is rendered in a sandbox the way
transformers and llama-cpp-python render it (``ImmutableSandboxedEnvironment`` with
``trim_blocks``/``lstrip_blocks``; ``messages``, ``add_generation_prompt``,
``bos_token``/``eos_token``, ``raise_exception``, ``strftime_now``, a non-escaping
``tojson``). A file without one can be given a template with ``--chat-template``: a
llama.cpp built-in name (``chatml``, ``llama3``, ``gemma``, ...) rendered by llama.cpp's
own C++ code, or a Jinja file. Without any template, chat is refused (never guessed).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from .engine import TextModel
from .errors import ChatTemplateError, ConfigError

ROLES = ("system", "user", "assistant", "tool")
_PROBE = "SPECDECPROBE"  # a reply text no template rewrites, to find what follows a reply


class ChatFormatter(Protocol):
    """Renders a conversation (``[{"role": ..., "content": ...}, ...]``) into prompt text."""

    name: str

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The prompt text; with ``add_generation_prompt`` it ends where the assistant's reply begins."""
        ...


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers replaces Jinja's tojson: no HTML escaping, and these options exposed.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class JinjaChatTemplate:
    """A Jinja chat template rendered in a sandbox, with the variables transformers passes."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", name: str = "jinja") -> None:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                           extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as err:
            raise ChatTemplateError(f"chat template {name}: Jinja syntax error on line {err.lineno}: {err.message}") from None
        self.source, self.name = source, name
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        import jinja2

        try:
            return self._template.render(messages=[dict(m) for m in messages],
                                         add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as err:
            raise ChatTemplateError(f"chat template {self.name} failed to render: {type(err).__name__}: {err}") from None


class BuiltinChatTemplate:
    """One of llama.cpp's built-in templates, by name, rendered by llama.cpp itself."""

    def __init__(self, name: str) -> None:
        names = builtin_template_names()
        if name not in names:
            raise ConfigError(f"chat template {name!r} is not a llama.cpp built-in (one of: {', '.join(names)})")
        self.name = name

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        from .engines.llama_cpp.vocab import apply_chat_template

        pairs = [(str(m["role"]), str(m["content"])) for m in messages]
        return apply_chat_template(self.name, pairs, add_generation_prompt, what=f"chat template {self.name}")


def builtin_template_names() -> list[str]:
    """llama.cpp's built-in chat template names."""
    from .engines.llama_cpp.vocab import builtin_chat_templates

    return builtin_chat_templates()


def special_text(model: TextModel, token: int) -> str:
    """The text of a special token such as BOS (empty when the model has none)."""
    if token is None or token < 0:
        return ""
    return model.token_to_piece(token, special=True).decode("utf-8", errors="replace")


def load_chat_template(model: TextModel, override: str | None = None) -> ChatFormatter | None:
    """The formatter for ``model``: ``override`` (a Jinja file or a built-in name) else the file's template.

    Returns None when neither exists; chat then has to be refused (see :func:`require_template`).
    """
    specials = {"bos_token": special_text(model, model.bos_token), "eos_token": special_text(model, model.eos_token)}
    if override is not None:
        path = Path(override).expanduser()
        if path.is_file():
            try:
                source = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise ConfigError(f"--chat-template {override}: cannot be read ({err})") from None
            return JinjaChatTemplate(source, name=str(path), **specials)
        if override in builtin_template_names():
            return BuiltinChatTemplate(override)
        raise ConfigError(f"--chat-template {override!r} is neither a file nor a llama.cpp built-in template "
                          f"(one of: {', '.join(builtin_template_names())})")
    source = model.chat_template
    if source:
        return JinjaChatTemplate(source, name="tokenizer.chat_template", **specials)
    return None


def require_template(formatter: ChatFormatter | None, model: TextModel) -> ChatFormatter:
    """``formatter``, or a ChatTemplateError saying the model has no chat template and what to do."""
    if formatter is None:
        name = getattr(model, "model_path", "the model")
        raise ChatTemplateError(
            f"{Path(str(name)).name} has no chat template (tokenizer.chat_template); start with "
            f"--chat-template NAME|FILE (e.g. chatml, gemma, llama3) or use plain completions")
    return formatter


def normalize_messages(messages: Any) -> list[dict[str, str]]:
    """Check an OpenAI-style message list and flatten text content parts to strings.

    Accepts ``content`` as a string or a list of ``{"type": "text", "text": ...}`` parts; the
    ``developer`` role is read as ``system``. Raises ChatTemplateError naming the bad message.
    """
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {role, content} objects")
    out: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatTemplateError(f"{where} must be an object with 'role' and 'content', got {message!r}")
        role = "system" if message.get("role") == "developer" else message.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"{where}.role = {message.get('role')!r} must be one of {list(ROLES) + ['developer']}")
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ChatTemplateError(f"{where}.content[{j}] must be a text part "
                                            f"{{'type': 'text', 'text': ...}} (this server reads text only)")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise ChatTemplateError(f"{where}.content must be a string or a list of text parts, got {content!r}")
        out.append({"role": role, "content": content})
    return out


def chat_prompt_tokens(model: TextModel, text: str) -> list[int]:
    """Tokenize rendered chat text (special tokens parsed) with exactly one BOS where the model wants one.

    Templates that write ``bos_token`` themselves would otherwise get a second BOS from the
    tokenizer (llama.cpp's server strips it the same way).
    """
    tokens = model.tokenize(text, add_bos=False, special=True)
    bos = model.bos_token
    if model.add_bos and bos is not None and bos >= 0 and (not tokens or tokens[0] != bos):
        tokens.insert(0, bos)
    return tokens


def end_of_turn_tokens(formatter: ChatFormatter, model: TextModel) -> frozenset[int]:
    """The special token that closes an assistant turn in this template (e.g. ``<|im_end|>``).

    Found by rendering a probe reply and reading the first token after it; empty when the
    template puts no special token there. Decoding stops on it even where the vocabulary
    does not mark it end-of-generation.
    """
    try:
        text = formatter.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}],
                                add_generation_prompt=False)
    except (ChatTemplateError, ConfigError):
        return frozenset()
    at = text.rfind(_PROBE)
    if at < 0:
        return frozenset()
    tail = text[at + len(_PROBE):].lstrip()
    tokens = model.tokenize(tail, add_bos=False, special=True) if tail else []
    if tokens and not model.token_to_piece(tokens[0], special=False) and model.token_to_piece(tokens[0], special=True):
        return frozenset({tokens[0]})
    return frozenset()
