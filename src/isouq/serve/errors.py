"""The errors a request can cause, each with its HTTP status and the field it is about."""

from __future__ import annotations

from ..errors import InputError


class RequestError(InputError):
    """A request the server refuses: ``status`` (400, 401, 404, 413, 422, 429, 503, 504), the
    request field it is about (``param``, e.g. ``messages`` or ``pairs[2].answer``), and a
    message that names the limit or the fix."""

    def __init__(self, message: str, *, status: int = 422, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    @property
    def kind(self) -> str:
        """OpenAI's error ``type`` for the status."""
        if self.status >= 500:
            return "timeout_error" if self.status == 504 else "server_error"
        return {401: "authentication_error", 404: "not_found_error",
                429: "rate_limit_error"}.get(self.status, "invalid_request_error")

    def body(self) -> dict:
        """The JSON body: OpenAI's ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code}}
