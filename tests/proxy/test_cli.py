"""The `radixgate` command: config show (masked, TOML that loads back), hash-key, exit code 2."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.config import MASK, load_settings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [name for name in __import__("os").environ if name.startswith("RADIXGATE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_config_show_toml_loads_back(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["config", "show", "--upstream", "http://h:8000", "--model", "a", "--model", "b", "--port", "9001"]
    assert main(args) == 0
    text = capsys.readouterr().out
    data = tomllib.loads(text)
    [worker] = data["workers"]
    assert (worker["url"], worker["models"], worker["kind"]) == ("http://h:8000", ["a", "b"], "openai")
    assert "api_key" not in worker  # null values are left out of TOML
    path = tmp_path / "shown.toml"
    path.write_text(text)
    assert load_settings(str(path), environ={}).server.port == 9001


def test_config_show_masks_secrets(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADIXGATE_AUTH__CACHE_SALT_SECRET", "hunter2")
    assert main(["config", "show", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["auth"]["cache_salt_secret"] == MASK


def test_hash_key(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["config", "hash-key", "abc"]) == 0
    assert (
        capsys.readouterr().out.strip() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO("abc\n"))
    assert main(["config", "hash-key"]) == 0
    assert capsys.readouterr().out.strip().startswith("ba7816bf")


def test_bad_setting_is_one_line_and_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--port", "70000"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "server.port (from --port)" in error
    assert main(["serve", "--upstream", "localhost:8000"]) == 2
    assert "workers[0].url (from --upstream" in capsys.readouterr().err


def test_console_script_exit_code(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "serve", "--model", str(tmp_path / "missing.gguf")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith(
        "radixgate: invalid setting local_engine.model_path (from --model)"
    )
