"""Live streams: audio arriving a little at a time, turned into confirmed, timed words as it comes
(``live.buffer``'s policy), on the server's engines (:class:`LiveStreams`) or in-process on an offline
engine (:func:`stream_in_process`, the CLI's).

On the server, every open stream's decodes run in rounds, one after another: a round takes every
stream with ``STEP_S`` of new audio (or whose audio has ended), their decodes merged into one engine
batch (``driver.together``); the streams that were still in the round, or had too little new audio,
join the next. A client sending faster than real time gets a round after another, as fast as the
engines answer; with many streams, a round takes longer and each decode in it hears more. Each
stream's failure is its own (``driver.settled``). A stream closed mid-round is dropped at once; the
round's captures are fetched or discarded with the round, so nothing of it stays in the workers.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from vllm_whisper_align.align.results import Transcript
from vllm_whisper_align.align.words import Word
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.errors import InputError
from vllm_whisper_align.live.buffer import MAX_WAITING_S, READ_AHEAD_CHUNKS, Decode, RollingBuffer, Update
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.options import TranscriptionOptions
from vllm_whisper_align.runners import driver

logger = get_logger(__name__)


# ---------------------------------------------------------------------------- what a stream is told


@dataclass(frozen=True)
class Confirmed:
    """Words confirmed now (stream times), and the unconfirmed rest of the latest decode."""

    words: list[Word]
    partial: list[Word]


@dataclass(frozen=True)
class Finished:
    """The audio has ended and every word of it is confirmed: all of them."""

    words: list[Word]

    @property
    def text(self) -> str:
        return "".join(word.word for word in self.words).strip()


@dataclass(frozen=True)
class Failed:
    """A decode failed; the audio so far is dropped and the stream starts again from what comes next."""

    error: Exception


LiveEvent = Confirmed | Finished | Failed


@dataclass
class LiveStream:
    """One open stream: its rolling buffer, how it is decoded, and its events for the client."""

    id: str
    language: str | None = None
    prompt: str | None = None
    options: TranscriptionOptions = field(default_factory=TranscriptionOptions)
    buffer: RollingBuffer = field(default_factory=RollingBuffer)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    # A decode of this stream is in a round now.
    busy: bool = False
    # Set while its buffer has room for more audio (``RollingBuffer.has_room``): its client is read.
    room: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.room.set()

    def set_buffer(self, buffer: RollingBuffer) -> None:
        self.buffer = buffer
        self.check_room()

    def check_room(self) -> None:
        """``room`` as the buffer stands: set when more audio may come in, cleared when it may not."""
        if self.buffer.has_room:
            self.room.set()
        else:
            self.room.clear()

    @property
    def at_rest(self) -> bool:
        """Nothing of it is being decoded or waits to be: its client owes the next audio."""
        return not self.busy and not self.buffer.ended and not self.buffer.wants_decode()

    def decode_work(self, decode: Decode, facts: driver.EngineFacts) -> driver.Driver:
        return decode_work(decode, facts, self.language, self.prompt, self.options)


def decode_work(
    decode: Decode,
    facts: driver.EngineFacts,
    language: str | None,
    prompt: str | None,
    options: TranscriptionOptions,
) -> driver.Driver:
    """One decode of a stream's buffer, with word timings; the confirmed text before it (or the
    stream's own prompt) as the prompt, and the confirmed words in it as its prefix (``Decode``); at
    the first temperature of the schedule only. The fallback's
    retries at higher temperatures are left out: LocalAgreement already waits for two decodes to agree,
    a sampled retry's text agrees with little, and a short buffer that fails the thresholds would be
    decoded at every temperature, six decodes in one stream's turn (24 s of one in a trial)."""
    plan = yield from driver.transcription_plan(
        decode.samples,
        facts,
        language=language,
        prompt=decode.prompt or prompt,
        options=options,
        prefix=decode.prefix_in_samples,
    )
    plan.fallback = replace(plan.fallback, temperatures=plan.fallback.temperatures[:1])
    return (yield from driver.run_plan(plan, facts.tokens))


def believed_words(transcript: Transcript, options: TranscriptionOptions) -> list[Word] | None:
    """A decode's words, or None where it loops (a segment over the fallback's
    ``compression_ratio_threshold``: "aunt, aunt, aunt, …"): no decode agrees with such a text, and
    compared with the next it would only wipe the words that decode has to agree with."""
    threshold = options.fallback.compression_ratio_threshold
    if threshold is not None and any(s.compression_ratio > threshold for s in transcript.segments):
        return None
    return transcript.words or []


# ---------------------------------------------------------------------------- on the server


class TooManyStreams(Exception):
    """Every place for a live stream is taken: the client may try again later."""


class LiveStreams:
    """The server's open streams, decoded in rounds on ``service``'s engines: at most ``max_streams`` at
    once, by default as many as the engines decode together (``service.windows_in_flight``), so that a
    round is one engine batch. Past that, each stream's words would come later for every stream open,
    and the audio they hold (up to ``max_waiting_s`` and a window each) would grow with no bound.

    A stream's client is read while less than ``max_waiting_s`` of its audio waits for a decode (its
    ``room``): the server's longest audio, rather than the few decodes' worth an in-process source is
    held to (``live.buffer.MAX_WAITING_S``). A socket not read is a connection lost: the keepalive
    pong comes in behind the audio sent before it, and uvicorn closes a connection whose pong is late
    (1011), so a client within the longest audio ahead of the engines is read at once."""

    def __init__(self, service: Any, max_streams: int | None = None, max_waiting_s: float = MAX_WAITING_S):
        self.service = service
        self.max_streams = max_streams or service.windows_in_flight
        self.max_waiting_s = max_waiting_s
        self.streams: dict[str, LiveStream] = {}
        self._wake = asyncio.Event()
        self._rounds: asyncio.Task | None = None
        self._round_numbers = itertools.count()

    def open(self, stream_id: str, **settings: Any) -> LiveStream:
        if len(self.streams) >= self.max_streams:
            raise TooManyStreams(
                f"this server decodes at most {self.max_streams} live streams at once, and as many are "
                "open; try again later"
            )
        stream = LiveStream(stream_id, buffer=RollingBuffer(max_waiting_s=self.max_waiting_s), **settings)
        self.streams[stream_id] = stream
        if self._rounds is None or self._rounds.done():
            self._rounds = asyncio.create_task(self._run_rounds())
        return stream

    def append(self, stream: LiveStream, samples: np.ndarray) -> None:
        stream.buffer.append(samples)
        stream.check_room()
        self._wake.set()

    def end(self, stream: LiveStream) -> None:
        """The stream's audio has ended: the rest is decoded and confirmed, then :class:`Finished`."""
        stream.buffer.end()
        self._settle(stream)
        self._wake.set()

    def close(self, stream: LiveStream) -> None:
        """The client has gone: its buffer goes now (a decode of it in a round is dropped there)."""
        self.streams.pop(stream.id, None)

    def stats(self) -> dict[str, int]:
        streams = list(self.streams.values())
        buffered = sum(len(s.buffer.audio) + int(s.buffer.new_seconds * SAMPLE_RATE) for s in streams)
        return {"live_streams": len(streams), "live_buffered_samples": buffered}

    # ---- rounds

    def _due(self) -> list[LiveStream]:
        """The streams of the next round: those not in a round with a decode due."""
        return [s for s in self.streams.values() if not s.busy and s.buffer.wants_decode()]

    async def _run_rounds(self) -> None:
        while True:
            due = self._due()
            if not due:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._round(due)

    async def _round(self, streams: list[LiveStream]) -> None:
        decodes = [stream.buffer.next_decode() for stream in streams]
        for stream in streams:
            stream.check_room()
        facts = self.service.facts
        work = driver.together(
            [driver.settled(s.decode_work(d, facts)) for s, d in zip(streams, decodes, strict=True)]
        )
        for stream in streams:
            stream.busy = True
        try:
            async with self.service.request_in_flight():
                answers = await self.service.run(work, f"live-{next(self._round_numbers)}", urgent=True)
        except Exception as error:  # the engines failed the round: every stream in it is told
            logger.exception("whisper-align: a live round failed")
            answers = [(None, error)] * len(streams)
        finally:
            for stream in streams:
                stream.busy = False
        for stream, decode, (transcript, error) in zip(streams, decodes, answers, strict=True):
            if stream.id not in self.streams:
                continue  # closed while its decode ran
            if error is not None:
                self._fail(stream, error)
                continue
            stream.language = stream.language or transcript.language
            update = stream.buffer.take(decode, believed_words(transcript, stream.options))
            stream.events.put_nowait(Confirmed(update.confirmed, update.partial))
            self._settle(stream)

    def _settle(self, stream: LiveStream) -> None:
        """An ended stream whose audio is all decoded: the rest confirmed, :class:`Finished`, and a new
        buffer for what may come next."""
        buffer = stream.buffer
        if stream.busy or not buffer.ended or buffer.arrived:
            return
        update = buffer.finish()
        if update.confirmed:
            stream.events.put_nowait(Confirmed(update.confirmed, []))
        stream.events.put_nowait(Finished(list(buffer.confirmed)))
        stream.set_buffer(buffer.following())

    def _fail(self, stream: LiveStream, error: Exception) -> None:
        if not isinstance(error, InputError):
            logger.error("whisper-align: a live decode of %s failed: %s", stream.id, error)
        stream.events.put_nowait(Failed(error))
        stream.set_buffer(stream.buffer.following())


# ---------------------------------------------------------------------------- in-process


def stream_in_process(
    aligner: Any,
    chunks: Iterable[np.ndarray],
    on_update: Callable[[Update], None],
    *,
    language: str | None = None,
    prompt: str | None = None,
    options: TranscriptionOptions | None = None,
) -> list[Word]:
    """A stream on an offline engine (``runners.offline.WhisperAligner``): ``chunks`` as they come
    (read in a thread: a file played at real time, or a pipe), decoded whenever a decode is due, each
    decode's update handed to ``on_update``; returns every confirmed word."""
    options = options or TranscriptionOptions()
    # Bounded, so that the reader waits while the buffer is full (``_receive``) instead of reading all of
    # a pipe or a file sent at once into memory.
    arrived: queue.Queue[np.ndarray | Exception | None] = queue.Queue(maxsize=READ_AHEAD_CHUNKS)
    reader = _start_reading(chunks, arrived)
    buffer = RollingBuffer()
    while not buffer.ended or buffer.arrived:
        _receive(buffer, arrived, block=not buffer.wants_decode())
        if not buffer.wants_decode():
            continue
        decode = buffer.next_decode()
        transcript = aligner.run(decode_work(decode, aligner.facts, language, prompt, options))
        language = language or transcript.language
        on_update(buffer.take(decode, believed_words(transcript, options)))
    on_update(buffer.finish())
    reader.join()
    return buffer.confirmed


def _start_reading(chunks: Iterable[np.ndarray], arrived: queue.Queue) -> Any:
    import threading

    def read() -> None:
        try:
            for chunk in chunks:
                arrived.put(chunk)
            arrived.put(None)
        except Exception as error:  # the source failed: raised where the chunks are taken
            arrived.put(error)

    reader = threading.Thread(target=read, name="live-audio", daemon=True)
    reader.start()
    return reader


def _receive(buffer: RollingBuffer, arrived: queue.Queue, block: bool) -> None:
    """What has arrived into ``buffer``, as long as it has room (waiting for something first if
    ``block``); None ends it."""
    while buffer.has_room:
        try:
            chunk = arrived.get(block=block)
        except queue.Empty:
            return
        block = False
        if isinstance(chunk, Exception):
            raise chunk
        if chunk is None:
            buffer.end()
            return
        buffer.append(chunk)
