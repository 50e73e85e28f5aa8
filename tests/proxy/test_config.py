"""Settings from TOML, RADIXGATE_* variables and flags; one-line errors naming the key."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path

import msgspec
import pytest

from proxy.config import MASK, SettingsError, load_settings, masked
from proxy.settings import DEFAULT_HOST, DEFAULT_PORT, Settings

TOML = """
[server]
port = 9000
host = "0.0.0.0"

[[workers]]
url = "http://10.0.0.5:8000"
models = ["llama"]
api_key = "upstream-secret"

[auth]
cache_salt_secret = "salt-secret"

[[auth.api_keys]]
tenant = "acme"
sha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

[telemetry]
service_name = "gw-1"
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "radixgate.toml"
    path.write_text(TOML)
    return path


def test_defaults_without_any_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(environ={})
    assert (settings.server.host, settings.server.port) == (DEFAULT_HOST, DEFAULT_PORT)
    assert settings.workers == [] and settings.telemetry.enabled


def test_file_then_environment_then_flags(config_file: Path) -> None:
    settings = load_settings(str(config_file), environ={})
    assert settings.server.port == 9000 and settings.workers[0].models == ["llama"]
    assert settings.auth.api_keys[0].tenant == "acme" and settings.telemetry.service_name == "gw-1"

    environ = {"RADIXGATE_SERVER__PORT": "9100", "RADIXGATE_TELEMETRY__ENABLED": "false"}
    settings = load_settings(str(config_file), environ=environ)
    assert settings.server.port == 9100 and settings.server.host == "0.0.0.0"
    assert not settings.telemetry.enabled

    settings = load_settings(str(config_file), environ=environ, overrides={"server.port": 9200})
    assert settings.server.port == 9200


def test_config_file_from_the_environment(config_file: Path) -> None:
    assert load_settings(environ={"RADIXGATE_CONFIG": str(config_file)}).server.port == 9000


def test_variables_that_are_not_settings_are_left_alone() -> None:
    settings = load_settings(environ={"RADIXGATE_CACHE_DIR": "/tmp/weights", "RADIXGATE_SOMETHING": "x"})
    assert settings.server.port == DEFAULT_PORT


def test_lists_from_the_environment_are_json() -> None:
    environ = {"RADIXGATE_WORKERS": '[{"url": "http://a:1", "models": ["m"]}, {"url": "https://b"}]'}
    settings = load_settings(environ=environ)
    assert [worker.url for worker in settings.workers] == ["http://a:1", "https://b"]


@pytest.mark.parametrize(
    ("environ", "line"),
    [
        (
            {"RADIXGATE_SERVER__PORT": "eighty"},
            "invalid setting server.port (from RADIXGATE_SERVER__PORT): Expected `int`",
        ),
        ({"RADIXGATE_SERVER__PORT": "70000"}, "invalid setting server.port (from RADIXGATE_SERVER__PORT)"),
        (
            {"RADIXGATE_SERVR__PORT": "1"},
            "invalid setting servr (from RADIXGATE_SERVR__PORT): unknown setting",
        ),
        ({"RADIXGATE_ROUTING__MAX_ATTEMPTS": "0"}, "invalid setting routing.max_attempts"),
        (
            {"RADIXGATE_WORKERS": '[{"url": "ftp://x"}]'},
            "invalid setting workers[0].url (from RADIXGATE_WORKERS): expected an http",
        ),
        (
            {"RADIXGATE_LOCAL_ENGINE__PAGE_SIZE": "0"},
            "invalid setting local_engine (from RADIXGATE_LOCAL_ENGINE__PAGE_SIZE)",
        ),
        ({"RADIXGATE_LOCAL_ENGINE__COLOUR": "red"}, "invalid setting local_engine.colour"),
        ({"RADIXGATE_LOCAL_ENGINE__MODEL_PATH": "/no/such.gguf"}, "invalid setting local_engine.model_path"),
        ({"RADIXGATE_SERVER__LOG_LEVEL": "loud"}, "invalid setting server.log_level"),
    ],
)
def test_bad_settings_name_the_key_and_source(environ: dict[str, str], line: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(environ=environ)
    assert str(caught.value).startswith(line)
    assert "\n" not in str(caught.value)


def test_bad_file_values_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[auth.api_keys]]\ntenant = "a"\nsha256 = "not-hex"\n')
    with pytest.raises(
        SettingsError, match=r"auth\.api_keys\[0\]\.sha256 \(from .*bad\.toml\): expected 64 hex"
    ):
        load_settings(str(path), environ={})
    path.write_text("[server\nport = 1")
    with pytest.raises(SettingsError, match="invalid TOML"):
        load_settings(str(path), environ={})
    with pytest.raises(SettingsError, match="not found"):
        load_settings(str(tmp_path / "missing.toml"), environ={})


def test_masked_hides_secrets_only(config_file: Path) -> None:
    data = masked(load_settings(str(config_file), environ={}))
    assert data["workers"][0]["api_key"] == MASK
    assert data["auth"]["cache_salt_secret"] == MASK
    assert data["workers"][0]["url"] == "http://10.0.0.5:8000"
    assert "upstream-secret" not in str(data) and "salt-secret" not in str(data)


def test_example_config_in_deploy_is_valid() -> None:
    example = Path(__file__).parents[2] / "deploy" / "radixgate.toml"
    settings = load_settings(str(example), environ={})
    assert tomllib.loads(example.read_text())["server"]["port"] == settings.server.port


def _setting_keys(kind: object, prefix: str = "") -> list[str]:
    """Every leaf key of the settings tree, as written in docs (`workers[].url`)."""
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        fields = [(f.name, f.type) for f in msgspec.structs.fields(kind)]
    elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
        fields = [
            (f.name, hints)
            for f, hints in zip(dataclasses.fields(kind), typing.get_type_hints(kind).values(), strict=True)
        ]
    else:
        return []
    keys: list[str] = []
    for name, annotation in fields:
        args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
        if typing.get_origin(annotation) is list and _setting_keys(args[0]):
            keys += _setting_keys(args[0], f"{prefix}{name}[].")
        elif typing.get_origin(annotation) is dict and _setting_keys(args[1]):
            keys += _setting_keys(args[1], f"{prefix}{name}.<id>.")
        elif nested := [key for arg in args for key in _setting_keys(arg, f"{prefix}{name}.")]:
            keys += nested
        else:
            keys.append(prefix + name)
    return keys


def test_every_setting_is_documented() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    missing = [key for key in _setting_keys(Settings) if f"`{key}`" not in docs]
    assert not missing, f"add these keys to docs/configuration.md: {missing}"
