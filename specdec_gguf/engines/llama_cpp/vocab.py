"""A llama.cpp model's vocabulary: tokenize, detokenize, token texts, special tokens, chat template."""

from __future__ import annotations

import ctypes
from functools import cached_property
from typing import Sequence

import llama_cpp as lc

from ...errors import EngineError


class LlamaVocab:
    """Text <-> token ids for one loaded model (``llama_vocab``); ids are range-checked here."""

    def __init__(self, model: lc.llama_model_p, what: str) -> None:
        self._model = model
        self._vocab = lc.llama_model_get_vocab(model)
        self.what = what  # names the model in errors
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))

    def check_id(self, token: int) -> int:
        token = int(token)
        if not 0 <= token < self.n_vocab:
            raise EngineError(f"{self.what}: token id {token} is outside the vocabulary [0, {self.n_vocab})")
        return token

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        data = _utf8(text, self.what)
        cap = len(data) + 8
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            raise EngineError(f"{self.what}: llama.cpp could not tokenize the text ({len(data)} bytes)")
        return list(buf[:n])

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        token = self.check_id(token)
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:max(n, 0)]

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return b"".join(self.token_to_piece(t, special) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return 0 <= token < self.n_vocab and bool(lc.llama_vocab_is_eog(self._vocab, token))

    @property
    def chat_template(self) -> str | None:
        raw = lc.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def format_chat(self, user_text: str) -> str:
        """``user_text`` as one user turn in llama.cpp's reading of the file's template."""
        template = lc.llama_model_chat_template(self._model, None)
        if not template:
            raise EngineError(f"{self.what}: the model has no chat template; drop --chat")
        return apply_chat_template(template, [("user", user_text)], True, what=self.what)

    @property
    def bos_token(self) -> int:
        return int(lc.llama_vocab_bos(self._vocab))

    @property
    def eos_token(self) -> int:
        return int(lc.llama_vocab_eos(self._vocab))

    @property
    def add_bos(self) -> bool:
        return bool(lc.llama_vocab_get_add_bos(self._vocab))

    @property
    def add_eos(self) -> bool:
        return bool(lc.llama_vocab_get_add_eos(self._vocab))

    @property
    def vocab_type(self) -> int:
        return int(lc.llama_vocab_type(self._vocab))

    @cached_property
    def token_texts(self) -> tuple[bytes, ...]:
        """Every token's text, read once and cached (for the vocabulary check)."""
        get = lc.llama_vocab_get_text
        return tuple(get(self._vocab, i) or b"" for i in range(self.n_vocab))


def builtin_chat_templates() -> list[str]:
    """The names of llama.cpp's built-in chat templates (``chatml``, ``llama3``, ``gemma``, ...)."""
    n = lc.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    lc.llama_chat_builtin_templates(names, n)
    return [name.decode() for name in names]


def apply_chat_template(template: bytes | str, messages: Sequence[tuple[str, str]], add_generation_prompt: bool,
                        *, what: str = "llama.cpp") -> str:
    """Render ``(role, content)`` messages with llama.cpp's C++ template for ``template``.

    ``template`` is a built-in name or a Jinja source that llama.cpp recognises by its markers.
    """
    raw = template.encode() if isinstance(template, str) else template
    encoded = [(_utf8(role, what), _utf8(content, what)) for role, content in messages]
    for (_, content), (_, text) in zip(encoded, messages):
        if b"\0" in content:  # llama.cpp takes C strings: everything after a NUL would silently vanish
            raise EngineError(f"{what}: the prompt contains a NUL character (at character {text.index(chr(0))}); "
                              "llama.cpp's chat templates cannot take it")
    chat = (lc.llama_chat_message * max(len(encoded), 1))(
        *(lc.llama_chat_message(role, content) for role, content in encoded))
    cap = 2 * sum(len(r) + len(c) for r, c in encoded) + 512
    buf = ctypes.create_string_buffer(cap)
    n = lc.llama_chat_apply_template(raw, chat, len(encoded), add_generation_prompt, buf, cap)
    if n > cap:
        buf = ctypes.create_string_buffer(n)
        n = lc.llama_chat_apply_template(raw, chat, len(encoded), add_generation_prompt, buf, n)
    if n < 0:
        raise EngineError(f"{what}: llama.cpp does not support this chat template")
    return buf.raw[:n].decode("utf-8", errors="replace")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate, e.g. from undecodable bytes in a file name
        raise EngineError(f"{what}: the text is not valid Unicode ({err.reason}: {text[err.start]!r} "
                          f"at character {err.start})") from None
