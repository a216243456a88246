"""A streamed answer that fails after its 200 has gone out: the client reads an error event, then the
end of the stream (``server.streaming``), through Starlette's HTTP stack; and one that is silent a
while: heartbeats the client skips, and the answer cancelled with the stream.

No request this server takes fails after its stream starts (every mistake is a 400 before it:
tests/server/test_streaming.py), so the failure is the event source's own here."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from openai._streaming import SSEDecoder

from vllm_whisper_align.errors import AlignmentInputError
from vllm_whisper_align.formats import events
from vllm_whisper_align.server import streaming


class Counter:
    """What the stream needs of the service: its count of requests in flight."""

    def __init__(self):
        self.in_flight = 0

    @contextlib.asynccontextmanager
    async def request_in_flight(self):
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1


def streamed(failure: Exception) -> tuple[list, Counter]:
    counter = Counter()

    async def source():
        yield {"type": events.DELTA, "delta": " one", "window": {"index": 0, "start": 0.0, "end": 30.0}}
        raise failure

    app = FastAPI()
    app.get("/s")(lambda: streaming._event_stream(counter, "req-1", source()))  # type: ignore[arg-type]
    with TestClient(app) as client, client.stream("GET", "/s") as response:
        assert response.status_code == 200
        lines = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines], counter


@pytest.mark.parametrize(
    ("failure", "status", "kind"),
    [
        (AlignmentInputError("the text does not fit", "text"), 400, "invalid_request_error"),
        (RuntimeError("engine died"), 500, "server_error"),
    ],
)
def test_a_failure_after_the_start_is_an_error_event_then_the_end(failure, status, kind):
    received, counter = streamed(failure)
    delta, error, end = received
    assert delta["type"] == events.DELTA and end == "[DONE]"
    assert error["type"] == "error" and error["error"]["code"] == status and error["error"]["type"] == kind
    assert str(failure) in error["error"]["message"]
    assert counter.in_flight == 0


def test_a_silent_stream_sends_heartbeats_that_the_openai_client_skips(monkeypatch):
    """A long alignment's stream is silent until the whole recording is aligned: a proxy (nginx after
    60 s) or a client's read timeout would drop it. Comments keep it alive; the openai client's reader
    sees the events alone."""
    monkeypatch.setattr(streaming, "HEARTBEAT_S", 0.05)
    first = {"type": events.DELTA, "delta": " one", "window": {"index": 0, "start": 0.0, "end": 30.0}}
    last = {"type": events.DONE, "text": " one"}

    async def source():
        yield first
        await asyncio.sleep(0.4)
        yield last

    app = FastAPI()
    app.get("/s")(lambda: streaming._event_stream(Counter(), "req-1", source()))  # type: ignore[arg-type]
    with TestClient(app) as client, client.stream("GET", "/s") as response:
        raw = response.read()
    lines = raw.decode().split("\n\n")
    assert lines[0] == events.server_sent(first).strip() and lines.count(events.HEARTBEAT.strip()) >= 2, lines
    assert lines.index(events.HEARTBEAT.strip()) < lines.index(events.server_sent(last).strip())
    decoded = [event.data for event in SSEDecoder().iter_bytes(iter([raw]))]
    assert decoded == [json.dumps(first), json.dumps(last), "[DONE]"], decoded


@pytest.mark.parametrize("how", ["closed", "cancelled"])
def test_a_stream_closed_or_cancelled_while_silent_cancels_its_answer(how):
    """The client gone while no event is ready (Starlette cancels the response, or closes its body):
    the answer awaited behind the heartbeats is cancelled, not left running."""
    cancelled: list[str] = []

    async def answer():
        yield "data: first\n\n"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("cancelled")
            raise

    async def client_gone() -> tuple[list[str], list[str]]:
        stream = streaming.with_heartbeats(answer(), 0.01)
        received = [await anext(stream), await anext(stream)]
        if how == "closed":
            await stream.aclose()
        else:
            reading = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.005)
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
        for _ in range(3):
            await asyncio.sleep(0)
        return received, list(cancelled)  # before asyncio.run cancels what is left at its end

    received, seen = asyncio.run(client_gone())
    assert received == ["data: first\n\n", events.HEARTBEAT] and seen == ["cancelled"], (received, seen)
