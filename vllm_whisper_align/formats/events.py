"""A streamed answer's events: a file's windows as server-sent events, in the shapes of OpenAI's streamed
transcription (``transcript.text.delta``, ``transcript.text.done``) with word timings added.

Each window, once final, is one ``transcript.text.delta`` event: its text as ``delta`` (the deltas joined
and stripped are the transcript's ``text``) and, as extensions, ``window`` (its index and where it lies in
the audio), its ``segments`` and its ``words`` and ``tokens`` (absolute times), as the granularities
asked. The last event is ``transcript.text.done``: OpenAI's ``text`` and the rest of the whole
``verbose_json`` body, the same as the request without ``stream`` answers. An error after the stream has
started is an ``error`` event with OpenAI's error body (``server.errors``: the official client raises it
as an APIError). Pure: the server sends these (``server.streaming``).
"""

from __future__ import annotations

import bisect
import json
from typing import Any

from vllm_whisper_align.align.results import Transcript, WindowResult

DELTA = "transcript.text.delta"
DONE = "transcript.text.done"
ERROR = "error"
# vLLM's (and OpenAI's chat) end of a stream, after the last event.
END_OF_STREAM = "data: [DONE]\n\n"
# A comment line, which every server-sent-event reader skips (the openai client's too): sent while no
# event is ready, so that a proxy or client that drops a silent connection (nginx after 60 s) does
# not drop a long alignment's stream, which is silent until the whole recording is aligned.
HEARTBEAT = ": keepalive\n\n"


def verbose_body(transcript: Transcript, granularities: list[str]) -> dict[str, Any]:
    """OpenAI's verbose_json with what ``timestamp_granularities[]`` asks: words (and tokens) for
    ``word``, segments unless only ``word`` is asked (OpenAI's default is ``segment``)."""
    body = transcript.to_dict()
    if "word" not in granularities:
        body.pop("words", None)
        body.pop("tokens", None)
    if granularities and "segment" not in granularities:
        body["segments"] = None
    return body


def window_event(
    index: int,
    start: float,
    end: float,
    result: WindowResult | None,
    granularities: list[str],
    forced: bool = False,
) -> dict[str, Any]:
    """Window ``index`` (``start``-``end`` s of the audio) as a delta event; ``result`` None: nothing was
    said there (silence). ``forced``: a forced alignment's words, which say whether each is aligned."""
    segments = result.segments if result else []
    event: dict[str, Any] = {
        "type": DELTA,
        "delta": "".join(segment.text for segment in segments),
        "window": {"index": index, "start": round(start, 3), "end": round(end, 3)},
    }
    if not granularities or "segment" in granularities:
        event["segments"] = [segment.to_dict() for segment in segments]
    if "word" in granularities:
        event["words"] = [word.to_dict(with_aligned=forced) for word in (result.words if result else [])]
        event["tokens"] = [token.to_dict() for token in (result.tokens if result else [])]
        if result and result.alignment_error:
            event["alignment_error"] = result.alignment_error
    return event


def done_event(body: dict[str, Any]) -> dict[str, Any]:
    """The last event: the whole answer's body (its ``text`` is OpenAI's done event's)."""
    return {"type": DONE, **body}


def server_sent(event: dict[str, Any]) -> str:
    """One server-sent event carrying ``event`` as JSON."""
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"


def by_window(transcript: Transcript, bounds: list[tuple[float, float]]) -> list[WindowResult | None]:
    """A transcript's segments, words and tokens grouped by the window (``bounds``: start, end) their
    start falls in: a long-form alignment's answer, whose windows are final all at once, as windows."""
    starts = [start for start, _ in bounds]

    def window_of(seconds: float) -> int:
        return max(0, bisect.bisect_right(starts, seconds) - 1)

    results = [WindowResult([], [], []) for _ in bounds]
    for segment in transcript.segments:
        results[window_of(segment.start)].segments.append(segment)
    for word in transcript.words or []:
        results[window_of(word.start)].words.append(word)
    for token in transcript.tokens or []:
        results[window_of(token.start)].tokens.append(token)
    return [result if result.segments or result.words else None for result in results]
