"""Load `Settings` from a TOML file, `RADIXGATE_*` environment variables and CLI overrides.

Each layer is merged key by key into one table, remembering where every key came from, then
the table is validated once. A bad value becomes one `SettingsError` line that names the key
and its source, e.g. `server.port (from RADIXGATE_SERVER__PORT): Expected int <= 65535`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from adapters.local.config import WINDOW_KEYS
from proxy.cache.config import cache_config
from proxy.cache.settings import CacheSettingsError
from proxy.errors import split_validation_error
from proxy.routing.config import WORKER_URL_PATTERN
from proxy.settings import SECRET_KEYS, SHA256_HEX_PATTERN, Settings

ENV_PREFIX = "RADIXGATE_"
ENV_SEPARATOR = "__"
CONFIG_ENV = "RADIXGATE_CONFIG"
"""Path of the TOML file when `--config` is not given (not itself a setting)."""
DEFAULT_CONFIG_FILE = "radixgate.toml"
"""Read from the working directory when neither `--config` nor `RADIXGATE_CONFIG` names a file."""

MASK = "********"

_PATTERN_MESSAGES = {
    WORKER_URL_PATTERN: "expected an http:// or https:// URL",
    SHA256_HEX_PATTERN: "expected 64 hex digits (print them with `radixgate config hash-key KEY`)",
}


class SettingsError(Exception):
    """A configuration problem, as one line that names the key."""


def load_settings(
    config_file: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
) -> Settings:
    """The effective settings: file, then environment, then `overrides` (dotted keys, from CLI flags;
    `flags` names the flag behind each key, for error messages)."""
    environ = os.environ if environ is None else environ
    table: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = _config_path(config_file, environ)
    if path is not None:
        _merge(table, sources, _read_toml(path), str(path), ())
    for name in sorted(environ):
        if _is_setting_variable(name):
            keys = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split(ENV_SEPARATOR))
            if not all(keys):
                raise SettingsError(f"{name}: empty key segment (use `__` only between keys)")
            _set(table, sources, keys, _env_value(environ[name]), name)
    for dotted, value in (overrides or {}).items():
        flag = (flags or {}).get(dotted) or f"--{dotted.rsplit('.', 1)[-1].replace('_', '-')}"
        _set(table, sources, tuple(dotted.split(".")), value, flag)
    return _validate(table, sources)


def _is_setting_variable(name: str) -> bool:
    """`RADIXGATE_A__B` always names a setting (so a typo is an error); `RADIXGATE_X` does when X is
    a section, which leaves `RADIXGATE_CONFIG`, `RADIXGATE_CACHE_DIR` and the like alone."""
    if not name.startswith(ENV_PREFIX):
        return False
    rest = name[len(ENV_PREFIX) :]
    return ENV_SEPARATOR in rest or rest.lower() in Settings.__struct_fields__


def masked(settings: Settings) -> dict[str, Any]:
    """The settings as plain data with every secret replaced by a mask."""
    data: dict[str, Any] = _mask(msgspec.to_builtins(settings, enc_hook=str))
    return data


def config_file_path(config_file: str | None = None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The TOML file `load_settings` reads: `config_file`, else `$RADIXGATE_CONFIG`, else
    ./radixgate.toml when it exists; None when there is none."""
    return _config_path(config_file, os.environ if environ is None else environ)


def _config_path(config_file: str | None, environ: Mapping[str, str]) -> Path | None:
    if config_file is None:
        config_file = environ.get(CONFIG_ENV)
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise SettingsError(f"config file {config_file}: not found")
        return path
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"config file {path}: cannot read it: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path}: invalid TOML: {exc}") from exc


def _env_value(raw: str) -> Any:
    """Lists and tables come as JSON (`RADIXGATE_WORKERS='[{"url": "http://h:8000"}]'`);
    scalars stay strings and are converted to the key's type on validation."""
    stripped = raw.strip()
    if stripped[:1] in ("[", "{"):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            return raw
    return raw


def _merge(
    table: dict[str, Any], sources: dict[str, str], layer: dict[str, Any], source: str, at: tuple[str, ...]
) -> None:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(table.get(key), dict):
            _merge(table[key], sources, value, source, (*at, key))
        else:
            table[key] = value
            sources[".".join((*at, key))] = source
    sources.setdefault(".".join(at), source)


def _set(
    table: dict[str, Any], sources: dict[str, str], keys: tuple[str, ...], value: Any, source: str
) -> None:
    node = table
    for depth, key in enumerate(keys[:-1]):
        sources.setdefault(".".join(keys[: depth + 1]), source)
        child = node.get(key)
        if not isinstance(child, dict):
            if child is not None:
                raise SettingsError(f"{source}: `{'.'.join(keys[: depth + 1])}` is not a table")
            child = node[key] = {}
        node = child
    node[keys[-1]] = value
    sources[".".join(keys)] = source


def _validate(table: dict[str, Any], sources: dict[str, str]) -> Settings:
    try:
        settings = msgspec.convert(table, Settings, strict=False, dec_hook=_decode_path)
    except msgspec.ValidationError as exc:
        message, key = split_validation_error(str(exc))
        if message.startswith("Object contains unknown field"):
            message = "unknown setting"
        elif message.startswith("Object missing required field"):
            message = "required setting is missing"
        for pattern, friendly in _PATTERN_MESSAGES.items():
            if repr(pattern) in message:
                message = friendly
        raise _error(key or "(root)", message, sources) from exc
    # LocalEngineConfig is a dataclass, which msgspec lets ignore unknown keys: check them here.
    local = table.get("local_engine")
    known = {f.name for f in dataclasses.fields(settings.local_engine)}
    for key in local if isinstance(local, dict) else ():
        if key not in known:
            raise _error(f"local_engine.{key}", "unknown setting", sources)
        if key in WINDOW_KEYS:
            raise _error(f"local_engine.{key}", "set in [sliding_window]", sources)
    try:
        settings.local_engine.validate()
    except ValueError as exc:
        raise _error("local_engine", str(exc), sources) from exc
    try:
        cache_config(settings)
    except CacheSettingsError as exc:
        raise _error(exc.key, exc.message, sources) from exc
    model_path = settings.local_engine.model_path
    if not settings.workers and model_path is not None and not model_path.expanduser().is_file():
        raise _error("local_engine.model_path", f"no such file: {model_path}", sources)
    return settings


def _decode_path(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")  # msgspec reports it per key


def _error(key: str, message: str, sources: dict[str, str]) -> SettingsError:
    source = _source_of(key, sources)
    where = f" (from {source})" if source else ""
    return SettingsError(f"invalid setting {key}{where}: {message}")


def _source_of(key: str, sources: dict[str, str]) -> str | None:
    """The layer that set `key` or the nearest table above it (`workers[0].url` -> `workers`)."""
    parts = key.replace("[", ".[").split(".")
    while parts:
        plain = ".".join(part for part in parts if not part.startswith("["))
        if plain in sources:
            return sources[plain]
        parts.pop()
    return sources.get("")


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: (MASK if key in SECRET_KEYS and item else _mask(item)) for key, item in value.items()}
    if isinstance(value, list):
        return [_mask(item) for item in value]
    return value
