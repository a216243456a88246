"""Streamed answers (``stream=true`` with ``response_format=verbose_json``): a file's windows sent as
server-sent events as each becomes final, then the whole body (``formats.events`` has the shapes).

Everything the request could get wrong is checked before the stream starts (a plain 400); what fails
after that arrives as an ``error`` event before the end of the stream, never as a stream cut short. A
client that goes away mid-stream cancels the answer: its engine requests are aborted and its captures
dropped (``runners.service``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import StreamingResponse

from vllm_whisper_align.align.results import Transcript
from vllm_whisper_align.audio.windows import AudioChunk, audible_windows
from vllm_whisper_align.errors import InputError
from vllm_whisper_align.formats import events
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.runners.service import AlignmentService
from vllm_whisper_align.server.errors import RequestError, error_body, http_error

logger = get_logger(__name__)


def windows_response(
    service: AlignmentService,
    plan: decoding.Plan,
    request_id: str,
    granularities: list[str],
    forced: bool = False,
) -> StreamingResponse:
    """``plan``'s windows streamed as each is final (``service.streamed``)."""

    async def window_events() -> AsyncIterator[dict[str, Any]]:
        index = 0
        async for item in service.streamed(plan, request_id):
            if isinstance(item, Transcript):
                yield events.done_event(await asyncio.to_thread(events.verbose_body, item, granularities))
                continue
            audio, result = item
            yield _window_event(index, audio, result, granularities, forced)
            index += 1

    return _event_stream(service, request_id, window_events())


def whole_response(
    service: AlignmentService,
    answer: Callable[[], Awaitable[Transcript]],
    audio: Any,
    request_id: str,
    granularities: list[str],
) -> StreamingResponse:
    """A long-form alignment streamed: its windows are final only once the whole recording is read
    (the text is placed over all of them, then checked), so they are all sent then, each as the
    window its words start in, before the body."""

    async def all_events() -> AsyncIterator[dict[str, Any]]:
        transcript = await answer()
        windows = audible_windows(audio)
        grouped = events.by_window(transcript, [(w.offset, w.offset + w.duration) for w in windows])
        for index, (window, result) in enumerate(zip(windows, grouped, strict=True)):
            yield _window_event(index, window, result, granularities, forced=True)
        yield events.done_event(await asyncio.to_thread(events.verbose_body, transcript, granularities))

    return _event_stream(service, request_id, all_events())


def _window_event(index: int, audio: AudioChunk, result, granularities: list[str], forced: bool) -> dict:
    return events.window_event(
        index, audio.offset, audio.offset + audio.duration, result, granularities, forced
    )


# Longest silence on a streamed answer before a heartbeat (``events.HEARTBEAT``).
HEARTBEAT_S = 15.0


async def with_heartbeats(lines: AsyncIterator[str], every_s: float) -> AsyncIterator[str]:
    """``lines``, with ``events.HEARTBEAT`` sent whenever none has come for ``every_s``. The next line
    is awaited in a task of its own, which the wait does not cancel (that would end the stream); the
    stream closed or cancelled (the client gone) cancels it, and so the answer, as without heartbeats."""
    iterator = aiter(lines)
    next_line: asyncio.Future[str] | None = None
    try:
        while True:
            next_line = asyncio.ensure_future(anext(iterator))
            while not (await asyncio.wait({next_line}, timeout=every_s))[0]:
                yield events.HEARTBEAT
            try:
                line = next_line.result()
            except StopAsyncIteration:
                return
            yield line
    finally:
        if next_line is not None:
            next_line.cancel()


def _event_stream(
    service: AlignmentService, request_id: str, stream: AsyncIterator[dict[str, Any]]
) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        async with service.request_in_flight():
            try:
                async for event in stream:
                    # Written in a thread: the last event of a long recording is its whole answer
                    # (as ``routes._rendered``).
                    yield await asyncio.to_thread(events.server_sent, event)
            except InputError as error:
                yield _error(http_error(error))
            except RequestError as error:
                yield _error(error)
            except Exception as error:  # the stream has started: the client is told, not cut off
                logger.exception("%s: the streamed answer failed", request_id)
                yield _error(RequestError(f"the answer failed: {type(error).__name__}: {error}", status=500))
            yield events.END_OF_STREAM

    return StreamingResponse(with_heartbeats(body(), HEARTBEAT_S), media_type="text/event-stream")


def _error(error: RequestError) -> str:
    return events.server_sent({"type": events.ERROR, **error_body(error.message, error.param, error.status)})
