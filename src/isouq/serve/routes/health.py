"""``GET /health`` (no key: whether the worker runs, the queue, the batches so far) and
``GET /metrics`` (Prometheus text, behind the key when there is one)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from .checks import authorized
from .state import server_of

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    """200 with ``status: ok`` while the worker runs, else 503 ``unavailable``."""
    server = server_of(request)
    batcher = server.batcher
    ok = batcher.alive
    body = {"status": "ok" if ok else "unavailable", "model": server.settings.model_id,
            "queue": batcher.depth, "batches": batcher.batches}
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics", dependencies=[Depends(authorized)])
async def metrics(request: Request):
    """The server's metrics (``isouq.serve.metrics``) in Prometheus' text format."""
    m = server_of(request).metrics
    return Response(m.text(), media_type=m.content_type)
