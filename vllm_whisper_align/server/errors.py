"""Errors as HTTP answers: OpenAI's error body, 400 for every mistake of the client's, never a 5xx for one.

The layers below raise domain errors (``vllm_whisper_align.errors``); :func:`http_error` maps them.
"""

from __future__ import annotations

import json
from http import HTTPStatus

from fastapi import FastAPI
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


def answer_errors_as_openai(app: FastAPI) -> None:
    """Every 4xx of ``app`` with OpenAI's error body, also those no route writes: Starlette's 404 and 405
    (``{"detail": ...}``) and vLLM's ``--api-key`` middleware's 401 (``{"error": "Unauthorized"}``), which
    the official client would otherwise show as an unreadable message.

    The middleware stack is built on the first request, after vLLM has added its own middleware: the
    built stack is wrapped, so the 401 is seen too (Starlette's ``build_middleware_stack``).
    """
    build = app.build_middleware_stack
    app.build_middleware_stack = lambda: OpenAIErrorBodies(build())  # type: ignore[method-assign]


class OpenAIErrorBodies:
    """ASGI wrapper: a 4xx JSON body not in OpenAI's shape is rewritten into it, its text kept."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, chunks = None, []

        async def send_rewritten(message):
            nonlocal start
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
                start = message  # held until the body is known
                return
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = _openai_shaped(b"".join(chunks), start["status"])
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_rewritten)


def _openai_shaped(body: bytes, status: int) -> bytes:
    """``body`` if it is OpenAI's error object already (or not JSON), else OpenAI's error object with its
    message (``detail`` or ``error`` as text)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return body
    detail = parsed.get("detail", parsed.get("error")) if isinstance(parsed, dict) else parsed
    if not detail:
        detail = HTTPStatus(status).phrase
    message = detail if isinstance(detail, str) else json.dumps(detail)
    return json.dumps(error_body(message, None, status)).encode()
