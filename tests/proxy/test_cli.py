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


def test_config_show_fills_in_the_values_the_preset_gives(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "radixgate.toml"
    config.write_text('[cache]\npreset = "production"\n\n[kv_cache]\nl1_capacity = 7\n')
    assert main(["config", "show", "--config", str(config)]) == 0
    data = tomllib.loads(capsys.readouterr().out)
    assert data["kv_cache"]["l1_capacity"] == 7  # set in the file: the file wins
    assert data["kv_cache"]["l2_capacity"] == 100_000  # from the production preset
    assert data["kv_cache"]["eviction_policy"] == "adaptive"
    assert data["monitoring"] == {
        "enabled": True,
        "collection_interval_seconds": 30.0,
        "detailed_profiling": True,
    }
    assert data["speculative"]["beam_width"] == 8


def test_config_show_survives_a_closed_pipe() -> None:
    """`radixgate config show | head`: the reader goes away before the output is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", "config", "show"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # closed before the child writes a byte: every write meets EPIPE
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 0, stderr
    assert stderr == ""
