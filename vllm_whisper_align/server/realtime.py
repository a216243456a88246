"""``/v1/realtime`` for Whisper: vLLM's realtime WebSocket protocol, with each confirmed word's times.

vLLM 0.32 registers its own ``/v1/realtime`` (``vllm/entrypoints/speech_to_text/realtime/``) only for
models that implement ``SupportsRealtime``: a model that takes a stream of audio into one engine request
and decodes it as it grows. Whisper does not (it hears a 30 s window at a time), so for Whisper vLLM
serves no such route; this plugin adds it, over its own streaming policy (``live``, ``runners.live``):
the audio is decoded again every half second of new audio, what two decodes agree on is confirmed and
timed.

The events are vLLM's, plus the words. From the client: ``session.update`` (``model``, optional here,
and as extensions ``language``, ``prompt`` and the transcription options of the form fields, JSON
values), ``input_audio_buffer.append`` (``audio``: base64 PCM16, 16 kHz, mono; decoding starts with the
first), ``input_audio_buffer.commit`` (``final: true`` ends the audio; without it, nothing to do: the
audio is decoded as it comes). To the client: ``session.created``; for each confirmed word a
``transcription.word`` (``word``, ``start``, ``end``, ``probability``, ``confidence``: seconds from the
stream's start) and then their text as one ``transcription.delta`` (the deltas joined are the text); the
unconfirmed rest of the latest decode as ``transcription.partial`` (``text``: it replaces the previous
partial, and may still change; vLLM's clients, which know no such event, ignore it); once the audio has
ended and every word is confirmed, ``transcription.done`` (``text``, and ``words``: all of them). A
mistake is an ``error`` event (``error``, ``code``), and the connection stays open.

Two things close a connection, each after an ``error`` event: every place for a stream is taken
(``too_many_streams``, WebSocket close code 1013, try again later), and a stream with nothing of it being
decoded that sends nothing for ``body_idle_s`` (``idle_timeout``, code 1000): a client that went quiet
without leaving would otherwise hold its place for ever.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect
from vllm.utils import random_uuid

from vllm_whisper_align.audio.pcm import pcm16_samples
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.errors import InputError
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.options import TRANSCRIPTION_OPTIONS, Option, TranscriptionOptions, echo
from vllm_whisper_align.runners.live import Confirmed, Failed, Finished, LiveEvent, LiveStream, TooManyStreams
from vllm_whisper_align.server.errors import RequestError, http_error
from vllm_whisper_align.server.limits import MAX_LIVE_STREAMS_ENV
from vllm_whisper_align.server.plugin import ServerState

logger = get_logger(__name__)

router = APIRouter()

# session.update's fields beyond ``type`` and ``model``; and the transcription options by name. The
# first are JSON strings (null: none), checked as options are: a form field is always text, a JSON value
# may be anything, and a number or an object taken here failed every decode after it.
SESSION_FIELDS = {
    option.name: option
    for option in (
        Option("language", str, None, "the language spoken (none: detected)"),
        Option("prompt", str, None, "text the decodes are prompted with"),
    )
}
OPTIONS = {option.name: option for option in TRANSCRIPTION_OPTIONS}
# input_audio_buffer.commit's ``final``: a JSON boolean, not a truthy value ("no" ended the audio).
FINAL = Option("final", bool, False, "the audio has ended")
# WebSocket close codes (RFC 6455; 1013 from IANA's registry): a normal close, and "try again later".
CLOSE_NORMAL, CLOSE_TRY_AGAIN_LATER = 1000, 1013


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    """Live audio in, confirmed words with their times out (the module's docstring has the events)."""
    await websocket.accept()
    state: ServerState | None = getattr(websocket.app.state, "whisper_align", None)
    if state is None:
        await _send(websocket, _error("word timestamps need an engine; this server has none", "no_engine"))
        await websocket.close()
        return
    try:
        stream = state.live.open(f"rt-{random_uuid()}")
    except TooManyStreams as error:
        logger.warning("whisper-align: a live stream refused: %s (%s)", error, MAX_LIVE_STREAMS_ENV)
        await _send(websocket, _error(str(error), "too_many_streams"))
        await websocket.close(CLOSE_TRY_AGAIN_LATER)
        return
    await RealtimeSession(websocket, state, stream).run()


class RealtimeSession:
    """One connection: its stream, the events it receives and those it sends."""

    def __init__(self, websocket: WebSocket, state: ServerState, stream: LiveStream):
        self.websocket, self.state, self.stream = websocket, state, stream
        self.partial = ""

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_events())
        try:
            await _send(
                self.websocket, {"type": "session.created", "id": self.stream.id, "created": int(time.time())}
            )
            while True:
                # Not read while the longest audio waits in the stream (runners.live.LiveStreams): the
                # socket's flow control then holds back a client that far ahead, at the engine's pace.
                await self.stream.room.wait()
                message = await self._next_message()
                if message is None:
                    break
                await self._handle(message)
        except WebSocketDisconnect:
            pass
        finally:
            self.state.live.close(self.stream)
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
            logger.info("%s: the connection is closed; its live buffer is dropped", self.stream.id)

    # ---- from the client

    async def _next_message(self) -> str | bytes | None:
        """The client's next message (bytes: a binary frame); None once it has sent nothing for
        ``body_idle_s`` while its stream was at rest (the connection is then closed, after an
        ``idle_timeout`` error)."""
        idle_s = self.state.limits.body_idle_s
        while True:
            try:
                return await asyncio.wait_for(self._receive(), idle_s)
            except TimeoutError:
                if self.stream.at_rest:
                    break
        await _send(self.websocket, _error(f"nothing came for {idle_s:g} s", "idle_timeout"))
        await self.websocket.close(CLOSE_NORMAL)
        return None

    async def _receive(self) -> str | bytes:
        """The next frame, text or binary: starlette's ``receive_text`` reads a binary frame's text as a
        KeyError, which closed the connection without a close frame."""
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message["code"], message.get("reason"))
        text = message.get("text")
        return text if text is not None else message.get("bytes") or b""

    async def _handle(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            await _send(self.websocket, _error("a binary frame: the events are JSON text", "invalid_json"))
            return
        try:
            event = json.loads(message)
        except json.JSONDecodeError:
            await _send(self.websocket, _error("the message is not JSON", "invalid_json"))
            return
        except RecursionError:  # lists or objects nested thousands deep
            await _send(self.websocket, _error("the message is JSON nested too deep", "invalid_json"))
            return
        kind = event.get("type") if isinstance(event, dict) else None
        handlers = {
            "session.update": self._session_update,
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit,
        }
        handler = handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            await _send(self.websocket, _error(f"unknown event type {echo(kind)}", "unknown_event"))
            return
        try:
            handler(event)
        except RealtimeError as error:
            await _send(self.websocket, _error(error.message, error.code))
        except InputError as error:
            await _send(self.websocket, _error(http_error(error).message, "invalid_request"))

    def _session_update(self, event: dict) -> None:
        """The stream's model, language, prompt and transcription options (for the decodes to come)."""
        unknown = [name for name in event if name not in ("type", "model", *SESSION_FIELDS, *OPTIONS)]
        if unknown:
            raise RealtimeError(f"session.update: unknown field {echo(unknown[0])}", "invalid_event")
        try:
            self.state.check_model(event.get("model"))
        except RequestError as error:
            raise RealtimeError(error.message, "model_not_found") from None
        # Every field is checked before any is set: a mistake leaves the session as it was.
        given = {name: SESSION_FIELDS[name].check(event[name]) for name in SESSION_FIELDS if name in event}
        language = given.get("language", self.stream.language)
        self.state.service.tokens.check_language(language or None)
        values = {name: OPTIONS[name].check(value) for name, value in event.items() if name in OPTIONS}
        options = TranscriptionOptions.from_checked(values) if values else self.stream.options
        self.stream.language = language or None
        self.stream.prompt = given.get("prompt", self.stream.prompt) or None
        self.stream.options = options

    def _append(self, event: dict) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise RealtimeError(
                "input_audio_buffer.append needs `audio`: base64 PCM16 at 16 kHz", "invalid_audio"
            )
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise RealtimeError("`audio` is not base64", "invalid_audio") from None
        if len(pcm) % 2:
            raise RealtimeError("`audio` is not PCM16: an odd number of bytes", "invalid_audio")
        if self.stream.buffer.ended:
            raise RealtimeError(
                "audio after `input_audio_buffer.commit` with `final`: wait for transcription.done",
                "invalid_audio",
            )
        samples = pcm16_samples(pcm)  # kept as PCM16 until a decode takes it in
        limit = self.state.limits.max_audio_s
        if len(samples) / SAMPLE_RATE > limit:  # more waiting is held back (``room``), never refused
            raise RealtimeError(f"one append of more than {limit:g} s of audio", "audio_too_long")
        self.state.live.append(self.stream, samples)

    def _commit(self, event: dict) -> None:
        if FINAL.check(event.get("final", False)):
            self.state.live.end(self.stream)

    # ---- to the client

    async def _send_events(self) -> None:
        while True:
            event = await self.stream.events.get()
            for message in self._messages(event):
                await _send(self.websocket, message)

    def _messages(self, event: LiveEvent) -> list[dict[str, Any]]:
        if isinstance(event, Failed):
            error = event.error
            if isinstance(error, InputError):
                return [_error(http_error(error).message, "invalid_request")]
            return [_error(f"the decode failed: {type(error).__name__}: {error}", "processing_error")]
        if isinstance(event, Finished):
            self.partial = ""
            words = [word.to_dict() for word in event.words]
            return [{"type": "transcription.done", "text": event.text, "words": words, "usage": None}]
        assert isinstance(event, Confirmed)
        messages = [{"type": "transcription.word", **word.to_dict()} for word in event.words]
        if event.words:
            messages.append({"type": "transcription.delta", "delta": "".join(w.word for w in event.words)})
        partial = "".join(word.word for word in event.partial)
        if partial != self.partial:
            messages.append({"type": "transcription.partial", "text": partial})
            self.partial = partial
        return messages


class RealtimeError(RequestError):
    """A mistake in an event: an ``error`` event with ``code``; the connection stays open."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def _error(message: str, code: str) -> dict[str, Any]:
    return {"type": "error", "error": message, "code": code}


async def _send(websocket: WebSocket, event: dict[str, Any]) -> None:
    await websocket.send_text(json.dumps(event, ensure_ascii=False))
