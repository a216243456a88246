"""A streamed answer that fails after its 200 has gone out: the client reads an error event, then the
end of the stream (``server.streaming``), through Starlette's HTTP stack.

No request this server takes fails after its stream starts (every mistake is a 400 before it:
tests/server/test_streaming.py), so the failure is the event source's own here."""

from __future__ import annotations

import contextlib
import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

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
