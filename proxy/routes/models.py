"""`GET /v1/models`: the models the router serves, in OpenAI's list shape."""

from __future__ import annotations

import time

from litestar import get
from litestar.handlers import HTTPRouteHandler

from proxy.gateway import Gateway
from proxy.schemas import ModelCard, ModelList

MODELS_PATH = "/v1/models"
OWNER = "radixgate"


def models_handlers(gateway: Gateway) -> list[HTTPRouteHandler]:
    created = int(time.time())

    @get(MODELS_PATH, sync_to_thread=False, name="list_models")
    def list_models() -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=model, created=created, owned_by=OWNER) for model in gateway.router.model_ids()
            ]
        )

    return [list_models]
