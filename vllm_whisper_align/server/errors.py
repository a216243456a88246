"""Errors as HTTP answers: OpenAI's error body, 400 for every mistake of the client's, never a 5xx for one.

The layers below raise domain errors (``vllm_whisper_align.errors``); :func:`http_error` maps them.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from vllm_whisper_align.audio.decode import AudioTooLongError
from vllm_whisper_align.errors import InputError
from vllm_whisper_align.server.limits import MAX_AUDIO_ENV

# Longest message in an error body.
MAX_MESSAGE_CHARS = 2000


class RequestError(Exception):
    """A client mistake (or an unavailable service): answered with ``status`` and OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        message = " ".join(message.split())
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        self.message = message
        self.param = param
        self.status = status


def http_error(error: InputError) -> RequestError:
    """The HTTP answer to a domain error."""
    if isinstance(error, AudioTooLongError):
        limit = error.max_seconds
        length = f"{error.seconds:.1f} s long" if error.seconds is not None else f"longer than {limit:g} s"
        return RequestError(
            f"audio is {length}; this server accepts at most {limit:g} s (set {MAX_AUDIO_ENV})", "file"
        )
    return RequestError(str(error), error.param)


def error_body(message: str, param: str | None = None, status: int = 400) -> dict:
    """OpenAI's error body (also what a streamed answer's error event carries)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(message: str, param: str | None = None, status: int = 400) -> JSONResponse:
    return JSONResponse(error_body(message, param, status), status_code=status)
