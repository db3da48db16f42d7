"""TOML run and batch configs -> validated frozen dataclasses.

Every error names the file, the key and the bad value. Relative paths resolve
against the config file's folder. See docs/configuration.md for every key.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import ConfigError
from .sampling import SamplingParams
from .settings import DrafterSettings, EngineSettings
from .stopping import check_stop_strings
from .textfiles import check_unicode, jsonl_lines, read_bytes, read_text

@dataclass(frozen=True)
class RunSettings:
    """One named way of generating: a drafter over the shared target, draft model and sampling."""

    name: str
    drafter: DrafterSettings
    sampling: SamplingParams
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings: generation ends where one appears in the text


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


@dataclass(frozen=True)
class BatchConfig:
    """A batch file: one target (and optional draft model), several runs over the same prompts."""

    path: Path
    target: EngineSettings
    draft: EngineSettings | None
    runs: tuple[RunSettings, ...]
    prompts: tuple[Prompt, ...]
    output: Path
    chat: bool = False

    def resolved(self) -> dict[str, Any]:
        """A JSON-ready record of every resolved setting (saved beside the results)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


_TOP_KEYS = {"target", "draft", "drafter", "sampling", "runs", "prompts", "prompts_file", "output",
             "max_tokens", "chat", "stop"}


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "None")


def _coerce(where: str, key: str, value: Any, tp: Any, base: Path) -> Any:
    """Check ``value`` against the annotation ``tp``; convert paths; raise naming where/key/value."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) == 1:
            return _coerce(where, key, value, options[0], base)
        for option in options:  # the first that accepts the value (e.g. exact = true | "warn")
            try:
                return _coerce(where, key, value, option, base)
            except ConfigError:
                pass
        allowed = " or ".join(_describe(o) if typing.get_origin(o) is not Literal
                              else " or ".join(repr(a) for a in typing.get_args(o)) for o in options)
        raise ConfigError(f"{where}: {key} = {value!r} must be {allowed}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {key} = {value!r} must be one of {list(typing.get_args(tp))}")
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: {key} = {value!r} must be a list")
        return [_coerce(where, f"{key}[{i}]", v, item, base) for i, v in enumerate(value)]
    if tp is Path:
        if not isinstance(value, str) or not value or "\0" in value:
            raise ConfigError(f"{where}: {key} = {value!r} must be a non-empty path string (no NUL)")
        check_unicode(value, f"{where}: {key}")
        path = Path(value).expanduser()
        return path if path.is_absolute() else base / path
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool) or not isinstance(value, tp):
        raise ConfigError(f"{where}: {key} = {value!r} must be of type {_describe(tp)}")
    if isinstance(value, str):
        check_unicode(value, f"{where}: {key}")  # a JSON "\udc80" could never be written back as UTF-8
    return value


def _build(cls: type, table: Any, where: str, base: Path, **extra: Any) -> Any:
    """Build dataclass ``cls`` from a TOML table, rejecting unknown keys and wrong types."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)} - set(extra)
    unknown = sorted(set(table) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(where, k, v, hints[k], base) for k, v in table.items()}
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs and f.name not in extra
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where}: missing required key {missing[0]!r}")
    try:
        return cls(**kwargs, **extra)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def engine_settings(table: Any, where: str, base: Path) -> EngineSettings:
    return _build(EngineSettings, table, where, base)


def drafter_settings(table: Any, where: str, base: Path) -> DrafterSettings:
    return _build(DrafterSettings, table, where, base)


def sampling_params(table: Any, where: str, base: Path) -> SamplingParams:
    return _build(SamplingParams, table, where, base)


def _load_toml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"{path}: no such config file")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a config file")
    try:
        return tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML ({err})") from None


def _table(data: dict[str, Any], key: str, where: str, default: Any) -> Any:
    """``data[key]`` if it is a table (``default`` when absent), else ConfigError naming it."""
    value = data.get(key, default)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} = {value!r} must be a table ([{key}] or {key} = {{...}})")
    return value


def _list(data: dict[str, Any], key: str, where: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {key} = {value!r} must be an array of tables ([[{key}]])")
    return value


def _max_tokens(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: max_tokens = {value!r} must be an integer >= 1")
    return value


def _prompts(data: dict[str, Any], path: Path, base: Path, required: bool) -> tuple[Prompt, ...]:
    prompts: list[Prompt] = []
    for i, table in enumerate(_list(data, "prompts", str(path))):
        prompts.append(_build(Prompt, table, f"{path}: [[prompts]] #{i + 1}", base))
    if "prompts_file" in data:
        file = _coerce(str(path), "prompts_file", data["prompts_file"], Path, base)
        prompts.extend(read_prompts_jsonl(file, f"{path}: prompts_file"))
    seen: set[str] = set()
    for p in prompts:
        if p.id in seen:
            raise ConfigError(f"{path}: duplicate prompt id {p.id!r}")
        seen.add(p.id)
    if not prompts and required:
        raise ConfigError(f"{path}: no prompts (add [[prompts]] tables or prompts_file)")
    return tuple(prompts)


def read_prompts_jsonl(file: Path, where: str) -> list[Prompt]:
    """Prompts from a JSONL file: one ``{"id": ..., "text": ...}`` object per line (lines end at ``\n`` only)."""
    data = read_bytes(file, f"{where} = {str(file)!r}")
    prompts = []
    for n, raw in jsonl_lines(data):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"{file}:{n}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                              "save it as UTF-8") from None
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{file}:{n}: invalid JSON ({err.msg} at column {err.colno})") from None
        except RecursionError:
            raise ConfigError(f"{file}:{n}: invalid JSON (nested too deeply)") from None
        prompts.append(_build(Prompt, obj, f"{file}:{n}", file.parent))
    return prompts


def _stop_strings(value: Any, where: str) -> tuple[str, ...]:
    try:
        return check_stop_strings(value, "stop")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def load_batch_config(path: str | Path, *, require_prompts: bool = True) -> BatchConfig:
    """Read and validate a batch config file (``specdec run --config`` needs no prompts)."""
    path = Path(path)
    return parse_batch_config(_load_toml(path), path, require_prompts=require_prompts)


def parse_batch_config(data: dict[str, Any], path: Path, *, require_prompts: bool = True) -> BatchConfig:
    """Validate a parsed config (``data`` as tomllib returns it; ``path`` names it and anchors relative paths).

    Any value of any shape gives a BatchConfig or a ConfigError naming the file and the key.
    """
    base = path.resolve().parent
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_TOP_KEYS))})")
    if "target" not in data:
        raise ConfigError(f"{path}: missing required table [target]")
    target = engine_settings(data["target"], f"{path}: [target]", base)
    draft = engine_settings(data["draft"], f"{path}: [draft]", base) if "draft" in data else None
    sampling_table = _table(data, "sampling", str(path), {})
    max_tokens = _max_tokens(data.get("max_tokens", 256), str(path))
    stop = _stop_strings(data.get("stop", []), str(path))
    default_drafter = _table(data, "drafter", str(path), {})
    run_tables = _list(data, "runs", str(path)) or [{"name": "default"}]
    runs = []
    for i, table in enumerate(run_tables):
        where = f"{path}: [[runs]] #{i + 1}"
        if not isinstance(table, dict) or not isinstance(table.get("name"), str):
            raise ConfigError(f"{where}: each run needs a string 'name'")
        table = dict(table)
        name = check_unicode(table.pop("name"), f"{where}: name")
        run_sampling = {**sampling_table, **_table(table, "sampling", where, {})}
        table.pop("sampling", None)
        run_max = _max_tokens(table.pop("max_tokens", max_tokens), where)
        run_stop = _stop_strings(table.pop("stop"), where) if "stop" in table else stop
        drafter = drafter_settings({**default_drafter, **table}, where, base)
        if drafter.kind == "draft-model" and draft is None:
            raise ConfigError(f"{where}: kind = 'draft-model' needs a [draft] table with the draft model")
        runs.append(RunSettings(name=name, drafter=drafter, max_tokens=run_max, stop=run_stop,
                                sampling=sampling_params(run_sampling, f"{where}: sampling", base)))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: duplicate run name {next(n for n in names if names.count(n) > 1)!r}")
    output = _coerce(str(path), "output", data.get("output", f"{path.stem}.results.jsonl"), Path, base)
    chat = data.get("chat", False)
    if not isinstance(chat, bool):
        raise ConfigError(f"{path}: chat = {chat!r} must be true or false")
    return BatchConfig(path=path, target=target, draft=draft, runs=tuple(runs),
                       prompts=_prompts(data, path, base, require_prompts), output=output, chat=chat)
