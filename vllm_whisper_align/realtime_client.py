"""A client of ``/v1/realtime`` (``server.realtime`` has the events): audio chunks sent as they come,
each confirmed word handed on as it arrives. The CLI's ``stream --server``.

The chunks come from a blocking source (a file played at real time, a pipe), read in a thread; the
words are received while the audio is still sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from vllm_whisper_align.audio.pcm import float_to_pcm16
from vllm_whisper_align.errors import InputError
from vllm_whisper_align.live.buffer import READ_AHEAD_CHUNKS

REALTIME_PATH = "/v1/realtime"
# The most one server message may be: transcription.done holds every word of the stream.
MAX_MESSAGE_BYTES = 2**26


def realtime_url(server: str) -> str:
    """``server`` (``http://host:port``, or a ``ws://`` URL) as the URL of its realtime route."""
    parts = urlsplit(server if "://" in server else f"http://{server}")
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise InputError(f"--server must be an http(s) or ws(s) URL; got {server!r}", "server")
    path = parts.path.rstrip("/")
    return urlunsplit(
        (scheme, parts.netloc, path if path.endswith(REALTIME_PATH) else path + REALTIME_PATH, "", "")
    )


def pcm16_base64(samples: np.ndarray) -> str:
    """float samples in [-1, 1] as the base64 PCM16 of ``input_audio_buffer.append``."""
    return base64.b64encode(float_to_pcm16(samples)).decode("ascii")


def stream_to_server(
    server: str,
    chunks: Iterable[np.ndarray],
    on_word: Callable[[dict[str, Any]], None],
    session: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``chunks`` (16 kHz float samples) streamed to ``server``; ``on_word`` gets each confirmed word
    (``word``, ``start``, ``end``, ``probability``, ``confidence``) as it arrives; returns
    ``transcription.done``.
    ``session``: the ``session.update`` fields (model, language, prompt, options). An ``error`` event
    from the server raises InputError; an unreachable server, OSError."""
    return asyncio.run(_stream(realtime_url(server), chunks, on_word, session or {}))


async def _stream(url: str, chunks: Iterable[np.ndarray], on_word, session: dict[str, Any]) -> dict[str, Any]:
    import websockets

    try:
        async with websockets.connect(url, max_size=MAX_MESSAGE_BYTES) as socket:
            _expect(json.loads(await socket.recv()), "session.created")
            if session:
                await socket.send(json.dumps({"type": "session.update", **session}))
            sender = asyncio.create_task(_send_audio(socket, chunks))
            try:
                return await _receive_words(socket, on_word, sender)
            finally:
                sender.cancel()
    except websockets.exceptions.InvalidStatus as error:
        raise OSError(f"{url}: the server refused the WebSocket ({error.response.status_code})") from None
    except websockets.exceptions.WebSocketException as error:
        raise OSError(f"{url}: {error}") from None


async def _send_audio(socket: Any, chunks: Iterable[np.ndarray]) -> None:
    loop = asyncio.get_running_loop()
    # Bounded: what the socket does not take yet (the server holds a client back only past its longest
    # audio waiting) waits in the reader, a pipe's or a file's, rather than in this queue.
    arrived: asyncio.Queue[np.ndarray | Exception | None] = asyncio.Queue(maxsize=READ_AHEAD_CHUNKS)

    def put(item: np.ndarray | Exception | None) -> None:
        putting = arrived.put(item)
        try:
            asyncio.run_coroutine_threadsafe(putting, loop).result()
        except BaseException:  # the stream is over: its loop closed, or this put cancelled with it
            putting.close()
            raise

    def read() -> None:
        try:
            for chunk in chunks:
                put(chunk)
            put(None)
        except Exception as error:  # the source failed: raised here, the audio not committed
            with contextlib.suppress(Exception):  # or the stream is over and nothing takes it
                put(error)

    threading.Thread(target=read, name="stream-audio", daemon=True).start()
    while (chunk := await arrived.get()) is not None:
        if isinstance(chunk, Exception):
            raise chunk
        if len(chunk):
            await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": pcm16_base64(chunk)}))
    await socket.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))


async def _receive_words(socket: Any, on_word, sender: asyncio.Task) -> dict[str, Any]:
    while True:
        received = asyncio.ensure_future(socket.recv())
        await asyncio.wait([received, sender], return_when=asyncio.FIRST_COMPLETED)
        if sender.done() and sender.exception() is not None:
            received.cancel()
            raise sender.exception()  # type: ignore[misc]
        event = json.loads(await received)
        kind = event.get("type")
        if kind == "transcription.word":
            on_word({key: value for key, value in event.items() if key != "type"})
        elif kind == "transcription.done":
            await sender
            return event
        elif kind == "error":
            raise InputError(f"the server: {event.get('error')} ({event.get('code')})")


def _expect(event: dict[str, Any], kind: str) -> None:
    if event.get("type") != kind:
        raise OSError(f"expected {kind} from the server; got {event.get('type')!r}: {event.get('error', '')}")
