"""Word timestamps while the audio arrives, through a real server process: a file streamed as
server-sent events (``stream=true`` with ``verbose_json``), and live audio over ``/v1/realtime`` with the
real ``websockets`` client."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets

from tests.support.servers import (
    IDLE_S,
    MAX_AUDIO_S,
    MAX_LIVE_STREAMS,
    TWO_AT_A_TIME,
    assert_openai_error,
    free_port,
    wav_bytes,
)
from tests.support.speech import align_words, concatenate_clips, long_clip, sentence_clips, word_errors
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.live import buffer as live_buffer

# What a realtime client sends at a time: 100 ms of PCM16.
CHUNK_S = 0.1


# ---------------------------------------------------------------------------- streamed files


def streamed_events(server: str, route: str, audio: bytes, **fields) -> list[dict | str]:
    """The events of a streamed answer, each parsed (the last is the string ``[DONE]``)."""
    with httpx.stream(
        "POST",
        f"{server}/v1/audio/{route}",
        files={"file": ("clip.wav", audio, "audio/wav")},
        data={"stream": "true", "response_format": "verbose_json", **fields},
        timeout=600,
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    return [payload if payload == "[DONE]" else json.loads(payload) for payload in data]


def assert_same_body(streamed, plain, path: str = "body") -> None:
    """The same answer: every text, id and structure equal, every number equal up to float32 noise
    (the windows ran in other engine batches than the plain request's: vLLM's kernels then sum in
    another order, tests/support/servers.py)."""
    if isinstance(plain, float) and isinstance(streamed, float):
        assert streamed == pytest.approx(plain, rel=1e-4, abs=1e-5), path
    elif isinstance(plain, dict):
        assert isinstance(streamed, dict) and streamed.keys() == plain.keys(), path
        for key in plain:
            assert_same_body(streamed[key], plain[key], f"{path}.{key}")
    elif isinstance(plain, list):
        assert isinstance(streamed, list) and len(streamed) == len(plain), path
        for index, (a, b) in enumerate(zip(streamed, plain, strict=True)):
            assert_same_body(a, b, f"{path}[{index}]")
    else:
        assert streamed == plain, path


def test_streamed_file_sends_each_window_in_order_then_the_plain_body(server):
    """A 100 s file: one delta per window in order, each window's words in it with absolute times, the
    deltas' words are the answer's, and the done event is the body the request without stream gets."""
    clip = long_clip(100.0)
    audio = wav_bytes(clip)
    fields = {"timestamp_granularities[]": ["word", "segment"]}
    plain = httpx.post(
        f"{server}/v1/audio/transcriptions",
        files={"file": ("clip.wav", audio, "audio/wav")},
        data={"response_format": "verbose_json", **fields},
        timeout=600,
    )
    assert plain.status_code == 200, plain.text
    events = streamed_events(server, "transcriptions", audio, **fields)

    assert events[-1] == "[DONE]"
    *deltas, done = events[:-1]
    assert done["type"] == "transcript.text.done"
    assert_same_body({k: v for k, v in done.items() if k != "type"}, plain.json())
    assert len(deltas) >= 4 and all(event["type"] == "transcript.text.delta" for event in deltas)
    assert [event["window"]["index"] for event in deltas] == list(range(len(deltas)))
    starts = [event["window"]["start"] for event in deltas]
    assert starts == sorted(starts) and starts[0] == 0.0 and deltas[-1]["window"]["end"] > 90.0
    for event in deltas:
        window = event["window"]
        for word in event["words"]:  # absolute times: within the window they came in
            assert window["start"] - 0.05 <= word["start"] <= word["end"] <= window["end"] + 0.05, (
                word,
                window,
            )
    assert [w for event in deltas for w in event["words"]] == done["words"]
    assert [s for event in deltas for s in event["segments"]] == done["segments"]
    assert "".join(event["delta"] for event in deltas).strip() == done["text"]
    # Later windows say what is spoken there: times run on across the file, not from each window's 0.
    assert done["words"][-1]["start"] > 90.0


def test_streamed_long_alignment_mistakes_are_a_400_before_the_stream(server):
    """A long-form alignment's text is checked before its stream starts: bad token ids are a plain 400
    naming the field (not an error event after a 200)."""
    audio = wav_bytes(long_clip(40.0))
    for fields, param in (({"tokens": "[99999]"}, "tokens"), ({"text": "  "}, "text")):
        response = httpx.post(
            f"{server}/v1/audio/alignments",
            files={"file": ("clip.wav", audio, "audio/wav")},
            data={"stream": "true", "response_format": "verbose_json", **fields},
            timeout=600,
        )
        assert_openai_error(response, param)


def test_streamed_alignment_of_one_window_matches_the_plain_body(server):
    clip = sentence_clips()[6]
    audio = wav_bytes(clip)
    plain = httpx.post(
        f"{server}/v1/audio/alignments",
        files={"file": ("clip.wav", audio, "audio/wav")},
        data={"text": clip.text, "response_format": "verbose_json"},
        timeout=600,
    )
    assert plain.status_code == 200, plain.text
    events = streamed_events(server, "alignments", audio, text=clip.text)
    delta, done, end = events
    assert end == "[DONE]" and delta["window"]["index"] == 0
    assert_same_body({k: v for k, v in done.items() if k != "type"}, plain.json())
    assert delta["words"] == done["words"] and plain_words(delta["words"]) == clip.words


# ---------------------------------------------------------------------------- live audio


def pcm16_chunks(samples: np.ndarray) -> list[str]:
    """``samples`` as base64 PCM16 chunks of CHUNK_S, as a realtime client sends them."""
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    step = int(CHUNK_S * SAMPLE_RATE)
    return [base64.b64encode(pcm[i : i + step].tobytes()).decode() for i in range(0, len(pcm), step)]


def realtime_url(server: str) -> str:
    return server.replace("http://", "ws://") + "/v1/realtime"


async def send_recording(socket, samples: np.ndarray, started: float, speed: float) -> None:
    """``samples`` sent on ``socket`` from ``started`` at ``speed`` times real time, then ``final``."""
    for index, chunk in enumerate(pcm16_chunks(samples)):
        due = started + index * CHUNK_S / speed
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
    await socket.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))


async def stream_live(server: str, samples: np.ndarray, speed: float = 1.0) -> dict:
    """``samples`` sent at ``speed`` times real time; every event the server sends until
    ``transcription.done``, each with the stream time it arrived at."""
    received: list[tuple[float, dict]] = []
    async with websockets.connect(realtime_url(server), max_size=2**24) as socket:
        created = json.loads(await socket.recv())
        assert created["type"] == "session.created", created
        await socket.send(json.dumps({"type": "session.update", "model": "whisper-tiny.en"}))
        started = time.monotonic()
        sender = asyncio.create_task(send_recording(socket, samples, started, speed))
        while True:
            event = json.loads(await asyncio.wait_for(socket.recv(), timeout=120))
            received.append(((time.monotonic() - started) * speed, event))
            if event["type"] in ("transcription.done", "error"):
                break
        await sender
    return {
        "events": [event for _, event in received],
        "words": [(at, event) for at, event in received if event["type"] == "transcription.word"],
    }


# A live word carries what a file's word does (its confidence too).
WORD_FIELDS = {"word", "start", "end", "probability", "confidence"}
# The streamed words against the offline transcription of the same audio: LocalAgreement confirms
# each word from decodes of a buffer cut mid-sentence, which hear a word or two otherwise than the
# whole file does (benchmarks/RESULTS.md#live-word-timestamps-v1realtime); streams that drop, repeat
# or mix up words are far over this.
MAX_WORD_ERROR_RATE = 0.2
# Live starts come from decodes of a cut buffer and are less sharp than a file's (RESULTS); a stream
# whose times are not the stream's (offset lost, another stream's) has next to none within 0.2 s.
MIN_STARTS_NEAR = 0.6


def assert_close_to_offline(heard: list[str], offline: list[str]) -> None:
    assert word_errors(offline, heard) <= MAX_WORD_ERROR_RATE * len(offline), (heard, offline)


def plain_words(words) -> list[str]:
    return [word["word"].strip(" .,!?;:\"'").lower() for word in words]


def assert_heard_to_the_end(words: list[dict], clip) -> None:
    """A stream of ``clip`` gave a word where its last word lies (however tiny.en spells it: "mat",
    "Matt."), and about as many words as it holds."""
    assert words and words[-1]["start"] >= clip.starts[-1] - 0.2, (plain_words(words), clip.starts[-1])
    assert len(words) >= 0.8 * len(clip.words), (plain_words(words), clip.words)


def offline_words(server: str, clip) -> list[str]:
    """The words of ``clip`` transcribed as a file (plain words)."""
    body = httpx.post(
        f"{server}/v1/audio/transcriptions",
        files={"file": ("clip.wav", wav_bytes(clip), "audio/wav")},
        data={"response_format": "verbose_json", "timestamp_granularities[]": "word"},
        timeout=600,
    ).json()
    return plain_words(body["words"])


def test_realtime_stream_gives_every_word_with_its_times(server):
    """Two sentences at real time: every word of the offline transcription of the same audio arrives as
    a transcription.word with start, end and probability, in order, at stream times; the deltas are
    their text, done holds all of them; partial text is marked as such."""
    clip = concatenate_clips(sentence_clips()[1:3])
    offline = offline_words(server, clip)
    live = asyncio.run(stream_live(server, clip.samples))
    events = live["events"]
    assert events[-1]["type"] == "transcription.done", events[-3:]
    words = [event for _, event in live["words"]]
    assert_close_to_offline(plain_words(words), offline)
    assert all(set(word) == {"type", *WORD_FIELDS} for word in words)
    assert all(
        0 <= w["start"] <= w["end"] <= clip.duration + 0.05 and 0 < w["probability"] <= 1 for w in words
    )
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)
    truth = dict(align_words([w.lower() for w in clip.words], plain_words(words)))
    close = [abs(words[j]["start"] - clip.starts[i]) <= 0.2 for i, j in truth.items()]
    assert len(truth) >= (1 - MAX_WORD_ERROR_RATE) * len(clip.words) and np.mean(close) >= MIN_STARTS_NEAR, (
        words,
        clip.starts,
    )
    deltas = "".join(event["delta"] for event in events if event["type"] == "transcription.delta")
    assert deltas == "".join(w["word"] for w in words)
    assert events[-1]["words"] == [{k: v for k, v in w.items() if k != "type"} for w in words]
    assert events[-1]["text"] == deltas.strip()
    assert any(event["type"] == "transcription.partial" for event in events)


def test_two_live_streams_at_once_are_not_mixed_up(server):
    """Two different recordings streamed at the same time (twice real time) each get their own words."""
    first = concatenate_clips(sentence_clips()[3:5])
    second = concatenate_clips(sentence_clips()[6:8])

    async def both():
        return await asyncio.gather(
            stream_live(server, first.samples, speed=2.0), stream_live(server, second.samples, speed=2.0)
        )

    offline = [offline_words(server, clip) for clip in (first, second)]
    live = [[event for _, event in stream["words"]] for stream in asyncio.run(both())]
    for own, other in ((0, 1), (1, 0)):
        heard = plain_words(live[own])
        assert len(align_words(offline[own], heard)) >= 0.8 * len(offline[own]), (heard, offline[own])
        assert len(align_words(offline[other], heard)) <= 0.5 * len(offline[other]), (heard, offline[other])
        assert len(heard) <= len(offline[own]) + 2, (heard, offline[own])


def live_stats(server: str) -> dict:
    return httpx.get(f"{server}/v1/audio/alignments/stats", timeout=30).json()


def test_a_client_that_leaves_mid_stream_frees_its_buffer_and_captures(server):
    """A client sends a minute of speech as fast as it can, and leaves while it is decoded (most of it
    waiting in the stream then): the stream, its buffered audio and every capture of its decodes are
    gone (the stats route), the server serves on."""
    clip = long_clip(60)

    async def leave_mid_stream() -> dict:
        async with websockets.connect(realtime_url(server), max_size=2**24) as socket:
            await socket.recv()

            async def send_all() -> None:
                for chunk in pcm16_chunks(clip.samples):
                    await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))

            sender = asyncio.create_task(send_all())
            while json.loads(await socket.recv())["type"] != "transcription.word":
                pass  # decoding has started
            stats = await asyncio.to_thread(live_stats, server)
            sender.cancel()
            return stats

    during = asyncio.run(leave_mid_stream())
    assert during["live_streams"] == 1 and during["live_buffered_samples"] > 0, during
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stats = live_stats(server)
        # A round that was decoding the stream's audio when it closed ends on its own: wait for it too.
        if (
            stats["live_streams"] == 0
            and stats["tracked"] == stats["parked"] == stats["requests_in_flight"] == 0
        ):
            break
        time.sleep(0.5)
    assert stats["live_streams"] == 0 and stats["live_buffered_samples"] == 0, stats
    assert stats["tracked"] == 0 and stats["parked"] == 0 and stats["requests_in_flight"] == 0, stats
    clip = sentence_clips()[0]
    live = asyncio.run(stream_live(server, clip.samples, speed=4.0))
    assert_heard_to_the_end([event for _, event in live["words"]], clip)


def test_a_client_ahead_of_the_engines_is_read_at_once_and_answers_the_keepalive(server):
    """A client sends most of the longest audio as fast as it can, then pings: the server has read it
    all (it waits in the stream, more than a few decodes' worth) and the pong comes back while it is
    decoded. A server that stopped reading at a few decodes' worth held the pong, as it holds uvicorn's
    keepalive pong, behind the audio: uvicorn closed such connections (1011) once 20 s late."""
    clip = long_clip(MAX_AUDIO_S - 20)
    few_decodes = (live_buffer.MAX_WAITING_S + live_buffer.WINDOW_S) * SAMPLE_RATE

    async def ahead_then_ping() -> dict:
        async with websockets.connect(realtime_url(server), max_size=2**24) as socket:
            await recv(socket)
            for chunk in pcm16_chunks(clip.samples):
                await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            await asyncio.wait_for(await socket.ping(), timeout=120)
            return await asyncio.to_thread(live_stats, server)

    held = asyncio.run(ahead_then_ping())
    assert held["live_streams"] == 1 and held["live_buffered_samples"] > few_decodes, (held, few_decodes)


def test_a_client_far_ahead_of_real_time_waits_at_the_engines_pace_and_loses_nothing(server):
    """A client sends more audio than the server takes waiting (MAX_AUDIO_S) as fast as it can: it is not
    refused but held back (the server stops reading its socket while that much waits in its stream),
    the audio the server holds for it stays within that and a window, and every part of the recording
    is confirmed."""
    clip = long_clip(MAX_AUDIO_S + 30)
    bound = (MAX_AUDIO_S + CHUNK_S + live_buffer.WINDOW_S + 1) * SAMPLE_RATE
    held: list[int] = []

    async def far_ahead() -> list[dict]:
        async with websockets.connect(realtime_url(server), max_size=2**24) as socket:
            await socket.recv()

            async def send_all() -> None:
                for chunk in pcm16_chunks(clip.samples):
                    await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
                await socket.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))

            async def watch() -> None:
                while True:
                    held.append((await asyncio.to_thread(live_stats, server))["live_buffered_samples"])
                    await asyncio.sleep(0.2)

            tasks = [asyncio.create_task(send_all()), asyncio.create_task(watch())]
            events = []
            while not events or events[-1]["type"] != "transcription.done":
                events.append(json.loads(await asyncio.wait_for(socket.recv(), timeout=120)))
            for task in tasks:
                task.cancel()
            return events

    events = asyncio.run(far_ahead())
    assert not [event for event in events if event["type"] == "error"], events[:3]
    assert held and max(held) <= bound, (max(held), bound)
    words = events[-1]["words"]
    assert words[-1]["end"] >= clip.duration - 5, (words[-1], clip.duration)
    assert len(words) >= 0.8 * len(clip.words), (len(words), len(clip.words))


async def recv(socket, timeout: float = 30) -> str:
    """The socket's next message; a TimeoutError, not a test that hangs, where none comes."""
    return await asyncio.wait_for(socket.recv(), timeout)


def wait_for_live_streams(server: str, count: int) -> dict:
    deadline = time.monotonic() + 30
    while (stats := live_stats(server))["live_streams"] != count and time.monotonic() < deadline:
        time.sleep(0.2)
    return stats


def test_live_streams_past_the_limit_are_refused_and_a_freed_place_is_taken_again(server):
    """With MAX_LIVE_STREAMS open, the next connection gets a too_many_streams error and is closed
    (1013: try again later); once one leaves, a new one is served."""
    assert wait_for_live_streams(server, 0)["live_streams"] == 0

    async def past_the_limit() -> tuple[dict, int | None, dict]:
        sockets = [await websockets.connect(realtime_url(server)) for _ in range(MAX_LIVE_STREAMS)]
        for socket in sockets:
            assert json.loads(await recv(socket))["type"] == "session.created"
        async with websockets.connect(realtime_url(server)) as refused:
            answer = json.loads(await recv(refused))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await recv(refused)
        await sockets.pop().close()
        await asyncio.to_thread(wait_for_live_streams, server, MAX_LIVE_STREAMS - 1)
        async with websockets.connect(realtime_url(server)) as again:
            created = json.loads(await recv(again))
        for socket in sockets:
            await socket.close()
        return answer, closed.value.rcvd.code if closed.value.rcvd else None, created

    answer, close_code, created = asyncio.run(past_the_limit())
    assert answer["type"] == "error" and answer["code"] == "too_many_streams", answer
    assert str(MAX_LIVE_STREAMS) in answer["error"], answer
    assert close_code == 1013
    assert created["type"] == "session.created", created
    assert wait_for_live_streams(server, 0)["live_streams"] == 0


def test_a_live_stream_that_goes_quiet_is_closed_and_frees_its_place(server):
    """A client that sends less audio than a decode takes and then nothing gets an idle_timeout error
    after IDLE_S and is closed; its stream is gone. (A client waiting for the decode of audio it has
    sent is not idle: tests/unit/test_live.py, test_a_stream_is_at_rest_...)"""

    async def go_quiet() -> tuple[list[dict], float, int | None]:
        events = []
        async with websockets.connect(realtime_url(server)) as socket:
            events.append(json.loads(await recv(socket)))
            chunk = pcm16_chunks(sentence_clips()[0].samples)[0]
            await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            quiet_since = time.monotonic()
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    events.append(json.loads(await recv(socket, timeout=IDLE_S + 30)))
            return (
                events,
                time.monotonic() - quiet_since,
                closed.value.rcvd.code if closed.value.rcvd else None,
            )

    events, quiet_for, close_code = asyncio.run(go_quiet())
    assert [event["type"] for event in events] == ["session.created", "error"], events
    assert events[-1]["code"] == "idle_timeout", events
    assert IDLE_S <= quiet_for < IDLE_S + 10 and close_code == 1000, (quiet_for, close_code)
    assert wait_for_live_streams(server, 0)["live_streams"] == 0


def test_realtime_mistakes_are_error_events_and_the_connection_stays(server):
    too_long = base64.b64encode(bytes(2 * int((MAX_AUDIO_S + 1) * SAMPLE_RATE))).decode()

    async def mistakes() -> list[dict]:
        async with websockets.connect(realtime_url(server)) as socket:
            await socket.recv()
            sent = [
                "not json",
                json.dumps({"type": "no.such.event"}),
                json.dumps({"type": "input_audio_buffer.append", "audio": "@@@"}),
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
                json.dumps({"type": "session.update", "model": "no-such-model"}),
                json.dumps({"type": "session.update", "temprature": 0.2}),
                json.dumps({"type": "input_audio_buffer.append", "audio": too_long}),
            ]
            answers = []
            for message in sent:
                await socket.send(message)
                answers.append(json.loads(await socket.recv()))
            return answers

    answers = asyncio.run(mistakes())
    assert [a["type"] for a in answers] == ["error"] * 7, answers
    codes = [a["code"] for a in answers]
    assert codes == [
        "invalid_json",
        "unknown_event",
        "invalid_audio",
        "invalid_audio",
        "model_not_found",
        "invalid_event",
        "audio_too_long",
    ]


def test_realtime_unreadable_messages_and_mistyped_fields_are_error_events_and_the_stream_goes_on(server):
    """A binary frame, JSON nested too deep to read, a `language` or `prompt` that is not a string, a
    `final` that is not a boolean and a `temperature` that is not a number: each an error event naming
    what is wrong (they raised out of the session, which dropped the connection without a close frame,
    or were taken: `"final": "no"` ended the audio, a prompt of {} failed every decode, a temperature
    of "0.2" was read from its text); the same connection then streams a recording and gets its words."""
    clip = sentence_clips()[0]
    sent = [
        b"\x00\x01",
        "[" * 100_000 + "]" * 100_000,
        json.dumps({"type": "session.update", "language": 5}),
        json.dumps({"type": "session.update", "prompt": {"a": 1}}),
        json.dumps({"type": "input_audio_buffer.commit", "final": "no"}),
        json.dumps({"type": "session.update", "temperature": "0.2"}),
    ]

    async def mistakes_then_audio() -> tuple[list[dict], list[dict]]:
        async with websockets.connect(realtime_url(server), max_size=2**24) as socket:
            await recv(socket)
            answers = []
            for message in sent:
                await socket.send(message)
                answers.append(json.loads(await recv(socket)))
            sender = asyncio.create_task(send_recording(socket, clip.samples, time.monotonic(), 4.0))
            events = [json.loads(await recv(socket, timeout=120))]
            while events[-1]["type"] not in ("transcription.done", "error"):
                events.append(json.loads(await recv(socket, timeout=120)))
            await sender
            return answers, events

    answers, events = asyncio.run(mistakes_then_audio())
    assert [a["type"] for a in answers] == ["error"] * len(sent), answers
    assert [a["code"] for a in answers] == ["invalid_json"] * 2 + ["invalid_request"] * 4, answers
    assert "binary" in answers[0]["error"] and "deep" in answers[1]["error"], answers
    for answer, field in zip(answers[2:], ("language", "prompt", "final", "temperature"), strict=True):
        assert f"`{field}`" in answer["error"], answer
    assert events[-1]["type"] == "transcription.done", events[-3:]
    assert_heard_to_the_end(events[-1]["words"], clip)


# ---------------------------------------------------------------------------- the CLI door


def run_stream_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    cli = str(Path(sys.executable).parent / "vllm-whisper-align")
    return subprocess.run([cli, "stream", *args], input=stdin, capture_output=True, timeout=900)


def pcm16_bytes(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def test_cli_streams_a_file_to_a_server_word_by_word(server, tmp_path):
    """`stream FILE --server URL --jsonl`: one JSON word a line (times, probability), the words of the
    offline transcription; a stream of stdin with an odd byte count, and a server that is not there,
    are one-line errors with a non-zero exit."""
    clip = concatenate_clips(sentence_clips()[4:6])
    path = tmp_path / "clip.wav"
    path.write_bytes(wav_bytes(clip))
    done = run_stream_cli(str(path), "--server", server, "--speed", "3", "--jsonl")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    words = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert_close_to_offline(plain_words(words), offline_words(server, clip))
    assert all(set(w) == WORD_FIELDS and w["start"] <= w["end"] for w in words)

    odd = run_stream_cli("-", "--server", server, stdin=pcm16_bytes(clip.samples[:16000]) + b"\0")
    assert odd.returncode != 0 and "odd number of bytes" in odd.stderr.decode(), odd.stderr.decode()
    gone = run_stream_cli(str(path), "--server", f"http://127.0.0.1:{free_port()}")
    assert gone.returncode != 0 and len(gone.stderr.decode().strip().splitlines()) == 1, gone.stderr.decode()
    for speed in ("-1", "nan"):
        refused = run_stream_cli(str(path), "--server", server, "--speed", speed)
        message = refused.stderr.decode()
        assert refused.returncode != 0 and f"--speed must be 0 or more; got {speed}" in message, message


def test_cli_streams_stdin_in_process(server):
    """`stream -` without --server: raw PCM16 on stdin through an engine in this process, each word
    printed as `start end word`; the words of the offline transcription (on the server: the same model)."""
    clip = sentence_clips()[2]
    done = run_stream_cli("-", "--dtype", "float32", stdin=pcm16_bytes(clip.samples))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    lines = [line.split(maxsplit=2) for line in done.stdout.decode().splitlines()]
    assert all(float(start) <= float(end) for start, end, _ in lines)
    assert_close_to_offline(
        plain_words([{"word": word} for _, _, word in lines]), offline_words(server, clip)
    )


# Files posted on a server that runs TWO_AT_A_TIME engine requests: most of their windows wait for the
# engines when the request under test comes.
FILES_AHEAD = 12


async def files_done_before(server: str, file: bytes, first_words) -> tuple[Any, int]:
    """FILES_AHEAD ``file``s posted, and once most of them wait for the engines, ``first_words(server)``
    awaited: its answer, and how many of the files were done before it."""
    from tests.support.servers import engine_counts

    finished: list[float] = []
    async with httpx.AsyncClient(timeout=600) as http:

        async def post() -> None:
            await transcribed(server, file, http)
            finished.append(time.monotonic())

        posts = [asyncio.create_task(post()) for _ in range(FILES_AHEAD)]
        deadline = time.monotonic() + 120
        while (await asyncio.to_thread(engine_counts, server))["waiting"] < FILES_AHEAD // 2:
            assert time.monotonic() < deadline and not finished, "the files never waited for the engines"
            await asyncio.sleep(0.05)
        answer = await first_words(server)
        done_before = len(finished)
        await asyncio.gather(*posts)
    return answer, done_before


async def first_streamed_event(server: str, audio: bytes) -> dict:
    """The first event of ``audio``'s streamed transcription (the connection then closed)."""
    async with httpx.AsyncClient(timeout=600) as http:
        fields = {"stream": "true", "response_format": "verbose_json", "timestamp_granularities[]": "word"}
        async with http.stream(
            "POST",
            f"{server}/v1/audio/transcriptions",
            files={"file": ("long.wav", audio, "audio/wav")},
            data=fields,
        ) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    return json.loads(line[len("data: ") :])
    raise AssertionError("the stream sent no event")


async def transcribed(
    server: str, audio: bytes, http: httpx.AsyncClient | None = None, **fields: str
) -> dict:
    """``audio``'s verbose_json with word timestamps (on ``http``, else a client of its own), with
    ``fields`` added to the form."""
    async with contextlib.AsyncExitStack() as stack:
        client = http or await stack.enter_async_context(httpx.AsyncClient(timeout=600))
        response = await client.post(
            f"{server}/v1/audio/transcriptions",
            files={"file": ("audio.wav", audio, "audio/wav")},
            data={"response_format": "verbose_json", "timestamp_granularities[]": "word", **fields},
        )
        response.raise_for_status()
        return response.json()


def test_short_and_live_requests_go_before_the_windows_of_longer_files(narrow_server):
    """Files over one window are posted until most of their windows wait for the engines. A live stream
    then sent faster than real time gets its last words, a streamed 65 s file its first window's words,
    and a 3 s clip its answer, while most files are still waiting: their engine requests go before
    those windows (vLLM's priority scheduling, serve's default). First come, first served, they waited
    behind every window posted before them, and the files were all done first."""
    file = wav_bytes(long_clip(31))  # two windows
    clip = sentence_clips()[1]
    streamed = wav_bytes(long_clip(65))
    server = narrow_server
    live, live_behind = asyncio.run(
        files_done_before(server, file, lambda base: stream_live(base, clip.samples, speed=10))
    )
    first, streamed_behind = asyncio.run(
        files_done_before(server, file, lambda base: first_streamed_event(base, streamed))
    )
    short, short_behind = asyncio.run(
        files_done_before(server, file, lambda base: transcribed(base, wav_bytes(clip)))
    )
    assert live["events"][-1]["type"] == "transcription.done", live["events"][-3:]
    assert live["words"], live["events"]
    assert first["type"] == "transcript.text.delta" and first.get("words"), first
    assert short["words"], short
    behind = (live_behind, streamed_behind, short_behind)
    assert max(behind) <= FILES_AHEAD // 2, behind


# Short requests posted one after another by FLOOD_CLIENTS clients, FLOOD_REQUESTS in all: more than the
# TWO_AT_A_TIME the engines run, so that some always wait for them while the flood lasts. The file (on
# `heads`) was answered after 13-15 of them on an AMD EPYC without AMX; it waits for them all where
# short requests always go first (a head start of 1e9 s: 90 of 90).
FLOOD_CLIENTS = 6
FLOOD_REQUESTS = 90


def test_a_flood_of_short_requests_holds_a_longer_file_back_no_longer_than_the_urgent_head_start(
    options_server,
):
    """Short requests go before the windows of longer files only by a head start (1 s here,
    ``whisper_align.urgent_head_start_s``): a file posted while clients keep more short requests
    waiting than the engines run is done while the flood goes on. With a constant priority for short
    requests it waited for the last of them.

    The file's words come from the heads alone (``alignment_method=heads``): the test is about the
    engines' order. `auto`'s acoustic model places them after the engine, at a lower CPU priority
    (``audio.phones.NICENESS``); where the flood holds every core, its search runs at a small share of
    one until the flood ends (docs/architecture.md, "Hostile input")."""
    from tests.support.servers import engine_counts

    file = wav_bytes(long_clip(31))  # two windows
    short = wav_bytes(sentence_clips()[1])

    async def flood_then_file(server: str) -> tuple[dict, int]:
        left, finished = [FLOOD_REQUESTS], [0]
        async with httpx.AsyncClient(timeout=600) as http:

            async def short_client() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    response = await http.post(
                        f"{server}/v1/audio/transcriptions",
                        files={"file": ("short.wav", short, "audio/wav")},
                        data={"response_format": "json"},  # not packed: one engine request each
                    )
                    response.raise_for_status()
                    finished[0] += 1

            clients = [asyncio.create_task(short_client()) for _ in range(FLOOD_CLIENTS)]
            deadline = time.monotonic() + 120
            while (await asyncio.to_thread(engine_counts, server))["waiting"] < TWO_AT_A_TIME:
                assert time.monotonic() < deadline and left[0] > 0, "the short requests never waited"
                await asyncio.sleep(0.05)
            answer = await transcribed(server, file, http, alignment_method="heads")
            done_before = finished[0]
            await asyncio.gather(*clients)
        return answer, done_before

    answer, done_before = asyncio.run(flood_then_file(options_server))  # TWO_AT_A_TIME, a head start of 1 s
    print(f"\nthe file was answered after {done_before} of the {FLOOD_REQUESTS} short requests")
    assert answer["duration"] > 30 and answer["words"], answer
    assert done_before <= FLOOD_REQUESTS * 2 // 3, done_before
