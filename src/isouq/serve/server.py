"""Start a server: check what a user can get wrong, load the model once, run uvicorn.

The model is loaded, warmed up and run on one thread (:class:`~.model_thread.ModelThread`),
never on the event loop's: a second thread running torch's parallel loops makes every batch
slower on the CPU (the module says why and how much).

uvicorn owns the signals: on SIGTERM (or Ctrl-C) it stops accepting connections and waits for
the requests in flight to be answered (up to ``--request-timeout`` seconds more); then the app's
shutdown lets the worker finish anything still queued and ends it.
"""

from __future__ import annotations

import ipaddress
import os
import socket

from ..errors import InputError
from .config import API_KEY_ENV, ServeSettings


def resolve_api_key(given: str | None) -> str | None:
    """``--api-key``, else the ``ISOUQ_API_KEY`` environment variable, else None."""
    if given is not None:
        return given
    return os.environ.get(API_KEY_ENV) or None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port(host: str, port: int) -> None:
    """InputError, before the model loads, when ``host:port`` cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise InputError(f"cannot listen on {host}:{port} ({e.strerror}); pass another "
                             "--port (or stop what uses it), or another --host") from None


def run_server(model: str, *, load: dict | None = None, calibration=None,
               settings: ServeSettings | None = None, host: str = "127.0.0.1",
               port: int = 8000, log_level: str = "info", say=print) -> None:
    """``isouq serve``: load ``model`` once and answer HTTP requests until SIGTERM/Ctrl-C.

    Args:
        model: registry name, folder, .gguf or hub id (``models.load_model``).
        load: options of ``models.load_model`` (device, dtype, trust_remote_code, ...).
        calibration: a ``Calibrator`` of this model (adds ``p_correct``/``withheld``).
        settings: limits and batching (:class:`ServeSettings`; ``model_id`` defaults to
            ``model``).
        host, port: where to listen (127.0.0.1: this machine only).
        log_level: uvicorn's log level.
        say: where the start-up lines go.
    """
    import uvicorn

    from ..models import check_loadable, load_model
    from .app import create_app
    from .engine import Engine
    from .model_thread import ModelThread

    settings = settings or ServeSettings(model_id=model)
    if not is_loopback(host) and settings.api_key is None:
        say(f"isouq serve: warning: listening on {host} without --api-key: anyone who can "
            f"reach this address can use the model (set --api-key or {API_KEY_ENV})")
    check_port(host, port)
    check_loadable(model)
    owner = ModelThread()
    lm, tok, info = owner.call(load_model, model, **(load or {}))
    files = getattr(info, "files", None)
    if calibration is not None:
        calibration.check_model(model, files)
    engine = owner.call(Engine, lm, tok, settings, calibration)
    owner.call(engine.warm_up)
    app = create_app(engine, settings, thread=owner, model_info={"model": str(model)})
    p = engine.params_summary()
    say(f"isouq serve: {settings.model_id} on http://{host}:{port} (page at /, OpenAI API "
        f"at /v1; {p.get('n_params', 0):,} parameters scored; batches of ≤ "
        f"{settings.max_batch}, waiting ≤ {settings.max_wait_ms:g} ms, "
        f"a pass ≈ {engine.pass_tokens:.0f} tokens' worth"
        f"{'; calibrated' if calibration is not None else ''}"
        f"{'; API key required' if settings.api_key else ''})")
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=int(settings.request_timeout_s) + 5,
                            timeout_keep_alive=5, access_log=log_level == "debug")
    uvicorn.Server(config).run()
