"""Worker launching: the SGLang command line, the CLI flags and their radixgate.toml equivalents."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxy.cache.config import local_engine_config
from proxy.config import SettingsError, load_settings
from proxy.routing.from_settings import child_worker_toml
from proxy.routing.launch import SGLangLaunchSettings, local_worker_command, sglang_command
from tests.e2e.routing_support import REPO


def test_sglang_replicas_get_their_own_gpu_with_cache_reports_and_metrics_on() -> None:
    settings = SGLangLaunchSettings(model_path="/models/llama", replicas=2, extra_args=["--tp", "1"])
    command = sglang_command(settings, replica=1, port=30001, python="python3")
    assert command[:3] == ["python3", "-m", "sglang.launch_server"]
    joined = " ".join(command)
    assert "--model-path /models/llama" in joined and "--host 127.0.0.1 --port 30001" in joined
    assert "--enable-cache-report" in command and "--enable-metrics" in command
    assert "--base-gpu-id 1" in joined and command[-2:] == ["--tp", "1"]


def test_sglang_replicas_sharing_one_gpu_split_its_memory() -> None:
    settings = SGLangLaunchSettings(model_path="m", replicas=4, share_gpu=True)
    command = sglang_command(settings, replica=3, port=1, python="python3")
    assert "--base-gpu-id" not in command
    assert command[command.index("--mem-fraction-static") + 1] == "0.212"


def test_a_launched_local_worker_never_launches_more() -> None:
    command = local_worker_command(8101, Path("/tmp/w.toml"), python="python3")
    assert command[command.index("--workers") + 1] == "0" and "--port" in command


def test_cli_flags_become_routing_settings() -> None:
    from proxy.cli import _parser, _settings

    args = _parser().parse_args(
        [
            "serve",
            "--worker",
            "sglang=http://127.0.0.1:30000",
            "--worker",
            "http://127.0.0.1:8000",
            "--policy",
            "least_load",
            "--workers",
            "2",
            "--launch-sglang",
            "/models/x",
            "--replicas",
            "3",
        ]
    )
    settings = _settings(args)
    assert [(w.kind, w.url) for w in settings.workers] == [
        ("sglang", "http://127.0.0.1:30000"),
        ("openai", "http://127.0.0.1:8000"),
    ]
    assert settings.routing.policy == "least_load" and settings.routing.local_workers == 2
    assert settings.routing.launch_sglang == SGLangLaunchSettings(model_path="/models/x", replicas=3)


def test_a_bad_worker_kind_is_one_clear_line() -> None:
    from proxy.cli import _parser, _settings

    with pytest.raises(SettingsError, match="kind must be one of"):
        _settings(_parser().parse_args(["serve", "--worker", "tgi=http://127.0.0.1:1"]))


def test_the_same_in_radixgate_toml(tmp_path: Path) -> None:
    config = tmp_path / "radixgate.toml"
    config.write_text(
        '[[workers]]\nurl = "http://127.0.0.1:30000"\nkind = "sglang"\nweight = 2.0\nmax_concurrency = 8\n\n'
        '[routing]\npolicy = "session"\nlocal_workers = 3\nhealth_failure_threshold = 4\n\n'
        "[routing.cache_aware]\ndecode_weight = 0.5\n\n"
        '[routing.launch_sglang]\nmodel_path = "/m"\nreplicas = 2\n'
    )
    settings = load_settings(str(config), environ={})
    spec = settings.workers[0]
    assert (spec.kind, spec.weight, spec.max_concurrency) == ("sglang", 2.0, 8)
    routing = settings.routing
    assert routing.policy == "session" and routing.health_failure_threshold == 4
    assert routing.cache_aware.decode_weight == 0.5
    assert settings.routing.local_workers == 3 and settings.routing.launch_sglang is not None


def test_launched_workers_inherit_the_local_engine_settings() -> None:
    settings = load_settings(None, environ={}, overrides={"local_engine.max_running": 4})
    text = child_worker_toml(settings)
    assert "[local_engine]" in text and "max_running = 4" in text


def test_launched_workers_inherit_the_sliding_window(tmp_path: Path) -> None:
    overrides = {"sliding_window.enabled": True, "sliding_window.window_size": 512}
    text = child_worker_toml(load_settings(None, environ={}, overrides=overrides))
    path = tmp_path / "child.toml"
    path.write_text(text)  # what the worker loads: the window from [sliding_window], not [local_engine]
    child = local_engine_config(load_settings(str(path), environ={}))
    assert (child.sliding_window, child.window_size, child.window_sink_tokens) == (True, 512, 4)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_launched_worker_dies_with_a_gateway_killed_by_sigkill(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    gateway_stand_in = (
        "import sys, time\n"
        "from proxy.routing.launch import _spawn\n"
        "worker = _spawn([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(worker.pid))\n"
        "time.sleep(120)\n"
    )
    gateway = subprocess.Popen([sys.executable, "-c", gateway_stand_in], cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the stand-in gateway never launched its worker"
            time.sleep(0.05)
        worker_pid = int(pid_file.read_text())
    finally:
        gateway.kill()
        gateway.wait()
    deadline = time.monotonic() + 10
    while _alive(worker_pid):
        assert time.monotonic() < deadline, "the worker outlived its killed gateway"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone: it has exited, only its entry remains)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_launched_workers_offload_kv_to_memory_only_with_a_cache_dir(tmp_path: Path) -> None:
    settings = load_settings(None, environ={}, overrides={"cache.dir": str(tmp_path)})
    text = child_worker_toml(settings)
    assert "kv_offload = true" in text and "kv_offload_dir" not in text  # one disk tier per process
