"""The gRPC front door in front of the embedded engine: `radixgate serve --grpc-port` with no upstream,
driven by the real `tritonclient.grpc`, its text compared with the same gateway's `/v1/completions`."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import tritonclient.grpc as grpcclient

from adapters.local import LocalEngineConfig
from tests.e2e.grpc_support import API_KEY, AUTH, ServedGateway, is_final, output_text, text_inputs

pytestmark = pytest.mark.slow

MODEL = LocalEngineConfig().model_id
PROMPT = "The capital of France is"
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedGateway]:
    # No response cache: every answer below comes from the engine, not from a stored one.
    config = """
[cache]
response_cache = false

[local_engine]
threads = 1
kv_budget_tokens = 8192
max_running = 4
"""
    gateway = ServedGateway(config, tmp_path_factory.mktemp("grpc-local")).start()
    yield gateway
    gateway.stop()
    assert "Traceback" not in gateway.stderr, gateway.stderr


@pytest.fixture
def triton(served: ServedGateway) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def http_text(served: ServedGateway) -> str:
    with openai.OpenAI(base_url=f"{served.http_url}/v1", api_key=API_KEY, max_retries=0, timeout=120) as sdk:
        text = sdk.completions.create(model=MODEL, prompt=PROMPT, **GREEDY).choices[0].text
    assert "Paris" in text
    return text


def test_the_embedded_model_is_a_ready_model(triton: grpcclient.InferenceServerClient) -> None:
    assert triton.is_server_ready()
    assert triton.is_model_ready(MODEL)
    assert triton.get_model_metadata(MODEL, as_json=True)["name"] == MODEL


def test_infer_equals_http_under_greedy(triton: grpcclient.InferenceServerClient, http_text: str) -> None:
    result = triton.infer(MODEL, text_inputs(PROMPT, GREEDY), headers=AUTH, client_timeout=120)
    assert output_text(result) == http_text
    whole = triton.infer(MODEL, text_inputs(PROMPT, GREEDY, exclude_input=False), headers=AUTH)
    assert output_text(whole) == PROMPT + http_text


def test_stream_chunks_add_up_to_the_http_text(
    triton: grpcclient.InferenceServerClient, http_text: str
) -> None:
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    triton.start_stream(callback=lambda result, error: responses.put((result, error)), headers=AUTH)
    try:
        triton.async_stream_infer(MODEL, text_inputs(PROMPT, GREEDY, stream=True))
        parts = []
        while True:
            result, error = responses.get(timeout=120)
            assert error is None, error
            parts.append(output_text(result))
            if is_final(result):
                break
    finally:
        triton.stop_stream()
    assert len(parts) > 1
    assert "".join(parts) == http_text
