"""``GET /v1/models`` and ``GET /v1/models/{name}``: the one model served, with the parameter
set scored, the calibration and the server's settings (never its key)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from .checks import authorized, check_model
from .state import ServerState, server_of

router = APIRouter(dependencies=[Depends(authorized)])


def model_card(server: ServerState) -> dict:
    """OpenAI's model object, with an ``isouq`` object: params, calibration, settings."""
    cal = server.engine.calibration
    return {"id": server.settings.model_id, "object": "model", "created": server.created,
            "owned_by": "isouq",
            "isouq": {"params": server.engine.params_summary(),
                      "calibration": None if cal is None else cal.describe(),
                      "settings": server.settings.public(),
                      "pass_tokens": _pass_tokens(server.engine), **server.model_info}}


def _pass_tokens(engine) -> float | None:
    """The engine's pass cost in tokens (``Engine.pass_tokens``), None when infinite or not
    known (JSON has no infinity)."""
    x = getattr(engine, "pass_tokens", None)
    return None if x is None or x == float("inf") else round(float(x), 1)


@router.get("/v1/models")
async def models(request: Request):
    """The list of models served: one."""
    return {"object": "list", "data": [model_card(server_of(request))]}


@router.get("/v1/models/{name:path}")
async def model(name: str, request: Request):
    """The served model's card; 404 for any other name."""
    server = server_of(request)
    check_model(server.settings, name)
    return model_card(server)
