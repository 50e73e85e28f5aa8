"""`radixgate`: serve the gateway, show the effective configuration, hash an API key.

    radixgate serve                                  # embedded engine on 127.0.0.1:8080
    radixgate serve --upstream http://h:8000 [--model NAME] [--host H] [--port P]
    radixgate serve --config radixgate.toml
    radixgate serve --cache-dir DIR                  # cached answers also kept on disk in DIR
    radixgate serve --grpc-port 8001                 # also the KServe v2 / Triton gRPC protocol
    radixgate config show [--format toml|json]       # secrets masked
    radixgate config hash-key [KEY]                  # SHA-256 for auth.api_keys (reads stdin without KEY)

A bad setting prints one line naming the key and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from adapters.local.config import WINDOW_KEYS
from proxy import __version__
from proxy.auth import hash_key, is_loopback
from proxy.banner import startup_banner
from proxy.cache.config import cache_config
from proxy.config import SettingsError, config_file_path, load_settings, masked
from proxy.routing.config import POLICY_NAMES, parse_worker_arg
from proxy.settings import Settings

EXIT_BAD_SETTINGS = 2
EXIT_STARTUP_FAILED = 3


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `radixgate` console script."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.config_command == "show":
            return _show(args)
        return _hash_key(args)
    except SettingsError as exc:
        print(f"radixgate: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixgate", description="OpenAI-compatible gateway for LLM engines."
    )
    parser.add_argument("--version", action="version", version=f"radixgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    _add_setting_flags(serve)

    config = commands.add_parser("config", help="inspect the configuration")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="print the effective settings (secrets masked)")
    _add_setting_flags(show)
    show.add_argument("--format", choices=("toml", "json"), default="toml")
    hash_cmd = config_commands.add_parser(
        "hash-key", help="print the SHA-256 of an API key for auth.api_keys"
    )
    hash_cmd.add_argument("key", nargs="?", help="the key; read from standard input when omitted")
    return parser


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="FILE", help="TOML settings file (default: $RADIXGATE_CONFIG, ./radixgate.toml)"
    )
    parser.add_argument(
        "--upstream", metavar="URL", action="append", help="OpenAI-compatible upstream (repeatable)"
    )
    parser.add_argument(
        "--model",
        metavar="NAME",
        action="append",
        help="with --upstream: a model it serves (repeatable; default: ask the upstream); "
        "without: a GGUF file for the embedded engine",
    )
    parser.add_argument(
        "--worker",
        metavar="KIND=URL",
        action="append",
        help="an engine worker, KIND one of sglang, vllm, openai (repeatable; a bare URL is openai)",
    )
    parser.add_argument("--policy", choices=POLICY_NAMES, help="routing policy (default cache_aware)")
    parser.add_argument(
        "--workers",
        metavar="N",
        type=int,
        help="start N embedded-engine worker processes and route over them",
    )
    parser.add_argument(
        "--launch-sglang",
        metavar="MODEL_PATH",
        help="start SGLang servers for MODEL_PATH (GPU host, sglang extra)",
    )
    parser.add_argument(
        "--replicas", metavar="N", type=int, help="with --launch-sglang: servers to start (default 1)"
    )
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8080)")
    parser.add_argument(
        "--grpc-port", type=int, help="also serve the KServe v2 gRPC inference protocol on this port"
    )
    parser.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"))
    parser.add_argument("--cache-dir", metavar="DIR", help="L3 disk cache tier in DIR (cache.dir)")


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["server.host"] = args.host
    if args.port is not None:
        overrides["server.port"] = args.port
    if args.grpc_port is not None:
        overrides["server.grpc_port"] = args.grpc_port
    if args.log_level is not None:
        overrides["server.log_level"] = args.log_level
    workers = [{"url": url, "models": list(args.model or [])} for url in args.upstream or []]
    for value in args.worker or []:
        try:
            spec = parse_worker_arg(value)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        workers.append({"url": spec.url, "kind": spec.kind, "models": list(args.model or [])})
    if args.cache_dir is not None:
        overrides["cache.dir"] = args.cache_dir
    if args.policy is not None:
        overrides["routing.policy"] = args.policy
    if args.workers is not None:
        overrides["routing.local_workers"] = args.workers
    if args.launch_sglang is not None:
        overrides["routing.launch_sglang"] = {
            "model_path": args.launch_sglang,
            "replicas": args.replicas or 1,
        }
    if workers:
        overrides["workers"] = workers
    elif args.model:
        if len(args.model) > 1:
            raise SettingsError("--model: the embedded engine serves one model file")
        overrides["local_engine.model_path"] = args.model[0]
    flags = {
        "workers": "--upstream/--worker",
        "local_engine.model_path": "--model",
        "routing.local_workers": "--workers",
        "routing.launch_sglang": "--launch-sglang",
        "cache.dir": "--cache-dir",
    }
    return load_settings(args.config, overrides=overrides, flags=flags)


def _serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    level = settings.server.log_level
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The server and the app are needed only here; `config` commands stay quick.
    from proxy.app import create_app
    from proxy.routing.from_settings import with_launched_workers
    from proxy.routing.launch import Launcher

    with Launcher() as launcher:
        # Until uvicorn installs its own handlers, SIGTERM must unwind through `with` so launched
        # workers are stopped (the default action would end this process on the spot).
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            settings = with_launched_workers(settings, launcher)
        except RuntimeError as exc:
            print(f"radixgate: {exc}", file=sys.stderr)
            return EXIT_STARTUP_FAILED
        finally:
            signal.signal(signal.SIGTERM, previous)
        logging.getLogger("radixgate").info("%s", startup_banner(settings, config_file_path(args.config)))
        return _run(settings, create_app)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _run(settings: Settings, create_app: Callable[[Settings], Any]) -> int:
    import uvicorn

    from proxy.http_protocol import guarded_protocol

    _warn_if_open(settings)
    level = settings.server.log_level
    config = uvicorn.Config(
        create_app(settings),
        host=settings.server.host,
        port=settings.server.port,
        log_level=level,
        access_log=settings.server.access_log,
        timeout_graceful_shutdown=int(settings.server.graceful_shutdown_s),
        lifespan="on",
        server_header=False,
        # Pinned, not "auto": auto falls back silently to the pure-Python h11 parser and the stdlib loop.
        loop="uvloop",
        http=guarded_protocol(settings.server.header_timeout_s, settings.server.max_header_bytes),
        ws="none",  # no WebSocket routes: an Upgrade request is served as plain HTTP, never left hanging
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else EXIT_STARTUP_FAILED


def _warn_if_open(settings: Settings) -> None:
    """A loud warning when the gateway listens beyond loopback with no API keys (docs/configuration.md)."""
    if not settings.auth.api_keys and not is_loopback(settings.server.host):
        logging.getLogger("radixgate").warning(
            "radixgate listens on %s with NO API KEYS: anyone who can reach this port can use every "
            "model. The admin API answers loopback clients only. Configure [[auth.api_keys]] "
            "(`radixgate config hash-key KEY`) before exposing it.",
            settings.server.host,
        )


def _show(args: argparse.Namespace) -> int:
    settings = _settings(args)
    data = with_preset_values(masked(settings), settings)
    text = json.dumps(data, indent=2) + "\n" if args.format == "json" else to_toml(data)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `radixgate config show | head`: the reader has all it wanted
        # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


PRESET_SECTIONS = ("kv_cache", "speculative", "sliding_window", "monitoring")
"""Sections whose unset keys the `cache.preset` fills in (`proxy.cache.config.ContextCacheConfig`)."""


def with_preset_values(data: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """`data` (the settings as plain data) with each preset section's effective values."""
    config = cache_config(settings)
    for section in PRESET_SECTIONS:
        effective = dataclasses.asdict(getattr(config, section))
        keys = type(getattr(settings, section)).__struct_fields__
        data[section] = {key: effective[key] for key in keys if key in effective}
    engine = data.get("local_engine")
    if isinstance(engine, dict):  # the embedded engine's window is shown (and set) in [sliding_window]
        for key in WINDOW_KEYS:
            engine.pop(key, None)
    return data


def _hash_key(args: argparse.Namespace) -> int:
    key = args.key if args.key is not None else sys.stdin.readline().strip()
    if not key:
        raise SettingsError("hash-key: give a non-empty key")
    print(hash_key(key))
    return 0


def to_toml(data: dict[str, Any]) -> str:
    """Plain settings data as TOML: scalars first, then tables, then arrays of tables; nulls omitted."""
    lines: list[str] = []
    _toml_table(data, (), lines)
    return "\n".join(lines).strip() + "\n"


def _toml_table(table: dict[str, Any], at: tuple[str, ...], lines: list[str]) -> None:
    scalars = {
        k: v for k, v in table.items() if v is not None and not _is_table(v) and not _is_table_array(v)
    }
    for key, value in scalars.items():
        lines.append(f"{key} = {_toml_value(value)}")
    for key, value in table.items():
        if _is_table(value):
            lines += ["", f"[{'.'.join((*at, key))}]"]
            _toml_table(value, (*at, key), lines)
        elif _is_table_array(value):
            for item in value:
                lines += ["", f"[[{'.'.join((*at, key))}]]"]
                _toml_table(item, (*at, key), lines)


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


if __name__ == "__main__":
    sys.exit(main())
