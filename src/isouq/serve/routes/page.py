"""``GET /``: the page (``isouq.serve.page``), one self-contained document; no key needed to
load it (it asks for one when the server has one)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ..page import PAGE

router = APIRouter()


@router.get("/", include_in_schema=False)
async def page():
    """The page's HTML."""
    return HTMLResponse(PAGE)
