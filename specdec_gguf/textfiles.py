"""Text a user hands us (prompt files, stdin, configs, JSONL): UTF-8 only, errors that say where.

JSONL records are separated by ``"\\n"`` alone. ``str.splitlines`` also breaks at U+2028,
U+2029, U+0085, form feeds and more, all of which may sit unescaped inside a JSON string, so
it would cut a valid record in two.
"""

from __future__ import annotations

import os
from typing import Iterator

from .errors import ConfigError

_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text, or ConfigError naming ``where``, the line and column of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        if data.startswith(_UTF16_BOMS):
            raise ConfigError(f"{where}: the file is UTF-16 text; save it as UTF-8") from None
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ConfigError(f"{where}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}); "
                          "save it as UTF-8") from None


def read_bytes(path: str | os.PathLike[str], where: str) -> bytes:
    """The file's bytes, or ConfigError naming ``where`` and the reason it can't be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a directory, not a file") from None
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read ({err.strerror or err})") from None


def read_text(path: str | os.PathLike[str], where: str | None = None) -> str:
    """A UTF-8 text file (a leading UTF-8 byte-order mark is dropped)."""
    where = where or str(path)
    text = decode_utf8(read_bytes(path, where), where)
    return text[1:] if text.startswith("\ufeff") else text


def jsonl_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` for each non-blank line, split on ``\\n`` only (a ``\\r`` before it is dropped)."""
    for number, line in enumerate(data.split(b"\n"), 1):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip():
            yield number, line


def check_unicode(text: str, where: str) -> str:
    """``text`` unchanged, or ConfigError if it holds a lone surrogate (it could not be written as UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ConfigError(f"{where}: {text[err.start]!r} at character {err.start} is not valid Unicode "
                          "(a lone surrogate)") from None
    return text

