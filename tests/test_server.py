"""The endpoint plugin through a real server process and the official openai client."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import time

import httpx
import numpy as np
import openai
import pytest

from speech import SpokenClip, long_clip, sentence_clips, start_errors, synthesize_words, write_wav

MAX_AUDIO_S = 120


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """`vllm-whisper-align serve` as a user would start it, on a free local port.

    WHISPER_ALIGN_TEST_SERVER=http://host:port reuses a server already started the same way.
    """
    from conftest import running_server

    if os.environ.get("WHISPER_ALIGN_TEST_SERVER"):
        yield os.environ["WHISPER_ALIGN_TEST_SERVER"]
        return
    with running_server(
        model_dir, tmp_path_factory.mktemp("server"), "whisper-tiny.en",
        env={"VLLM_WHISPER_ALIGN_MAX_AUDIO_S": str(MAX_AUDIO_S)},
    ) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=600)


def wav_bytes(clip_or_samples) -> bytes:
    samples = clip_or_samples.samples if isinstance(clip_or_samples, SpokenClip) else clip_or_samples
    buffer = io.BytesIO()
    write_wav(buffer, samples)
    return buffer.getvalue()


def transcribe_raw(server: str, audio: bytes, **fields) -> httpx.Response:
    data = {name: [str(v) for v in value] if isinstance(value, list) else str(value) for name, value in fields.items()}
    return httpx.post(
        f"{server}/v1/audio/transcriptions",
        files={"file": ("clip.wav", audio, "audio/wav")},
        data=data,
        timeout=600,
    )


def assert_openai_error(response: httpx.Response, param_or_text: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert param_or_text in (error.get("param") or "") + error["message"]


def test_openai_client_gets_words(client):
    clip = sentence_clips()[1]
    result = client.audio.transcriptions.create(
        model="whisper-tiny.en",
        file=("clip.wav", wav_bytes(clip)),
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    words = [w.model_dump() for w in result.words]
    starts = np.array([w["start"] for w in words])
    assert np.all(np.diff(starts) >= 0)
    assert np.all([w["end"] >= w["start"] for w in words])
    assert (start_errors(clip, words) <= 0.2).mean() >= 0.75, (clip.text, words)
    assert result.language == "en" and result.duration == pytest.approx(clip.duration, abs=0.01)


def test_segment_and_word_granularities(server):
    clip = sentence_clips()[1]
    both = transcribe_raw(
        server, wav_bytes(clip), model="whisper-tiny.en", response_format="verbose_json",
        **{"timestamp_granularities[]": ["word", "segment"]},
    ).json()
    assert both["words"] and both["segments"]
    assert both["segments"][0]["start"] <= both["words"][0]["start"] + 0.5
    segments_only = transcribe_raw(
        server, wav_bytes(clip), response_format="verbose_json", **{"timestamp_granularities[]": "segment"}
    ).json()
    assert segments_only["segments"] and "words" not in segments_only
    tokens = both["tokens"]  # documented extension: per-token times
    assert all(t["start"] <= t["end"] for t in tokens)
    plain = transcribe_raw(server, wav_bytes(clip), response_format="text")
    assert plain.status_code == 200 and plain.text.strip() == both["text"].strip()


def distinct_clips(count: int) -> list[SpokenClip]:
    """Different sentences with different gap patterns: every clip's audio is unique."""
    sentences = [c.words for c in sentence_clips()]
    return [
        synthesize_words(sentences[i % len(sentences)], gap_s=0.15 + 0.1 * (i // len(sentences)))
        for i in range(count)
    ]


def test_32_concurrent_requests_each_match_their_clip(client, server):
    """Each of 32 concurrent answers equals its own clip served alone: text, and word times ±0.02 s."""
    clips = distinct_clips(32)

    def request(index, clip, client_):
        return client_.audio.transcriptions.create(
            model="whisper-tiny.en", file=(f"c{index}.wav", wav_bytes(clip)),
            response_format="verbose_json", timestamp_granularities=["word"],
        )

    alone = [request(i, clip, client) for i, clip in enumerate(clips)]

    async def run_all():
        async_client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", timeout=900)
        return await asyncio.gather(*[request(i, clip, async_client) for i, clip in enumerate(clips)])

    together = asyncio.run(run_all())
    for clip, single, batched in zip(clips, alone, together):
        assert single.text == batched.text
        np.testing.assert_allclose([w.start for w in single.words], [w.start for w in batched.words], atol=0.02 + 1e-6)
        np.testing.assert_allclose([w.end for w in single.words], [w.end for w in batched.words], atol=0.02 + 1e-6)
    # Clips i and i + 8 say the same sentence with other gaps: their word times must differ, so
    # equal answers above cannot come from answers being swapped between requests.
    for first, second in zip(together[:8], together[8:16]):
        assert [w.start for w in first.words][-1] != [w.start for w in second.words][-1]


def test_long_audio_across_chunk_joins(client):
    clip = long_clip(65.0)
    result = client.audio.transcriptions.create(
        model="whisper-tiny.en", file=("long.wav", wav_bytes(clip)),
        response_format="verbose_json", timestamp_granularities=["word", "segment"],
    )
    words = [w.model_dump() for w in result.words]
    starts = np.array([w["start"] for w in words])
    assert result.duration > 60 and starts[-1] > 55
    assert np.all(np.diff(starts) >= 0)
    errors = start_errors(clip, words)
    # No word lost or doubled at the joins: nearly every spoken word is heard once, no extras.
    assert np.isfinite(errors).mean() >= 0.85 and len(words) <= len(clip.words) + 3
    assert (errors <= 0.2).mean() >= 0.75
    assert result.segments[-1].end > 55


def test_forced_alignment_endpoint(server):
    clip = sentence_clips()[2]
    response = httpx.post(
        f"{server}/v1/audio/alignments",
        files={"file": ("c.wav", wav_bytes(clip), "audio/wav")},
        data={"model": "whisper-tiny.en", "text": clip.text},
        timeout=600,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert [w["word"].strip(" .").lower() for w in body["words"]] == [w.lower() for w in clip.words]
    starts = np.array([w["start"] for w in body["words"]])
    assert np.mean(np.abs(starts - np.array(clip.starts)) <= 0.2) >= 0.75
    ids = [t["id"] for t in body["tokens"]]
    by_tokens = httpx.post(
        f"{server}/v1/audio/alignments",
        files={"file": ("c.wav", wav_bytes(clip), "audio/wav")},
        data={"tokens": json.dumps(ids)},
        timeout=600,
    ).json()
    assert [w["start"] for w in by_tokens["words"]] == [w["start"] for w in body["words"]]


def test_forced_alignment_over_one_window(server):
    """A 65 s upload with its text: every word back in order, aligned, at absolute times; srt too."""
    clip = long_clip(65.0)
    def align(**fields):
        return httpx.post(
            f"{server}/v1/audio/alignments", files={"file": ("long.wav", wav_bytes(clip), "audio/wav")},
            data={"model": "whisper-tiny.en", "text": clip.text, **fields}, timeout=600,
        )
    response = align(response_format="verbose_json")
    assert response.status_code == 200, response.text
    body = response.json()
    assert [w["word"].strip(" .").lower() for w in body["words"]] == [w.lower() for w in clip.words]
    assert all(w["aligned"] for w in body["words"]) and body["duration"] > 60
    starts = np.array([w["start"] for w in body["words"]])
    assert np.all(np.diff(starts) >= 0) and starts[-1] > 55
    assert np.mean(np.abs(starts - np.array(clip.starts)) <= 0.2) >= 0.75
    srt = align(response_format="srt")
    assert srt.status_code == 200 and len(SRT_CUE.findall(srt.text)) == len(clip.words)


SRT_CUE = re.compile(r"(\d+)\n(\d\d:\d\d:\d\d,\d\d\d) --> (\d\d:\d\d:\d\d,\d\d\d)\n(.+?)(?:\n\n|\n?$)", re.S)
VTT_CUE = re.compile(r"(?:(\d\d):)?(\d\d:\d\d\.\d\d\d) --> (?:(\d\d):)?(\d\d:\d\d\.\d\d\d)\n(.+?)(?:\n\n|\n?$)", re.S)


def _seconds(stamp: str) -> float:
    parts = stamp.replace(",", ".").split(":")
    return sum(float(p) * 60**i for i, p in enumerate(reversed(parts)))


def test_srt_and_vtt(server):
    clip = sentence_clips()[3]
    srt = transcribe_raw(server, wav_bytes(clip), response_format="srt")
    assert srt.status_code == 200
    cues = SRT_CUE.findall(srt.text)
    assert cues and [int(c[0]) for c in cues] == list(range(1, len(cues) + 1))
    assert all(_seconds(c[1]) <= _seconds(c[2]) for c in cues)
    vtt = httpx.post(
        f"{server}/v1/audio/alignments",
        files={"file": ("c.wav", wav_bytes(clip), "audio/wav")},
        data={"text": clip.text, "response_format": "vtt"}, timeout=600,
    )
    assert vtt.text.startswith("WEBVTT")
    vtt_cues = VTT_CUE.findall(vtt.text)
    assert len(vtt_cues) >= 1 and all(cue[4].strip() for cue in vtt_cues)


def test_bad_inputs_get_400_and_server_keeps_serving(server, client):
    good = wav_bytes(sentence_clips()[4])
    no_file = httpx.post(f"{server}/v1/audio/transcriptions", data={"model": "whisper-tiny.en"}, timeout=60)
    assert_openai_error(no_file, "file")
    assert_openai_error(transcribe_raw(server, b"this is not audio at all" * 50), "file")
    assert_openai_error(transcribe_raw(server, b""), "file")
    assert_openai_error(transcribe_raw(server, good, model="no-such-model"), "model")
    assert_openai_error(
        transcribe_raw(server, good, response_format="json", **{"timestamp_granularities[]": "word"}),
        "verbose_json",
    )
    assert_openai_error(transcribe_raw(server, good, response_format="xml"), "response_format")
    assert_openai_error(
        transcribe_raw(server, good, response_format="verbose_json", stream="true",
                       **{"timestamp_granularities[]": "word"}),
        "stream",
    )
    too_long = np.zeros((MAX_AUDIO_S + 10) * 16000, dtype=np.float32)
    assert_openai_error(transcribe_raw(server, wav_bytes(too_long)), "file")
    translate = httpx.post(
        f"{server}/v1/audio/translations", files={"file": ("c.wav", good, "audio/wav")}, timeout=60
    )
    assert_openai_error(translate, "translate")

    def align(**data):
        return httpx.post(
            f"{server}/v1/audio/alignments", files={"file": ("c.wav", good, "audio/wav")}, data=data, timeout=120
        )

    assert_openai_error(align(text="word " * 500), "448")
    assert_openai_error(align(tokens=json.dumps([60000, 1])), "tokens")
    assert_openai_error(align(tokens="[1, 2"), "tokens")
    assert_openai_error(align(), "text")
    with pytest.raises(openai.BadRequestError):
        client.audio.transcriptions.create(
            model="whisper-tiny.en", file=("x.wav", b"RIFF....garbage"), response_format="verbose_json",
            timestamp_granularities=["word"],
        )

    silent = client.audio.transcriptions.create(
        model="whisper-tiny.en", file=("s.wav", wav_bytes(np.zeros(32000, dtype=np.float32))),
        response_format="verbose_json", timestamp_granularities=["word"],
    )
    assert silent.words == [] or silent.words is None or len(silent.words) <= 1
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200
    ok = client.audio.transcriptions.create(model="whisper-tiny.en", file=("ok.wav", good))
    assert ok.text.strip()


def engine_counts(server: str) -> dict[str, float]:
    """vLLM's own Prometheus gauges and counters: requests in the engine, and requests aborted."""
    text = httpx.get(f"{server}/metrics", timeout=30).text
    counts = {"running": 0.0, "waiting": 0.0, "aborted": 0.0}
    patterns = {
        "running": r"^vllm:num_requests_running\{[^}]*\} (\S+)$",
        "waiting": r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$",
        "aborted": r'^vllm:request_success_total\{[^}]*finished_reason="abort"[^}]*\} (\S+)$',
    }
    for name, pattern in patterns.items():
        counts[name] = sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))
    return counts


def test_disconnect_aborts_and_frees_capture(server):
    """A client that goes away while its windows are in the engine gets them aborted (vLLM counts
    them as aborted, not finished) and its capture freed; without the abort they would run on."""
    clip = long_clip(300.0)  # ten 30 s windows: far longer to transcribe than the wait below
    before = engine_counts(server)

    async def post_then_disconnect() -> None:
        async with httpx.AsyncClient(timeout=600) as http:
            request = asyncio.ensure_future(http.post(
                f"{server}/v1/audio/transcriptions",
                files={"file": ("long.wav", wav_bytes(clip), "audio/wav")},
                data={"response_format": "verbose_json", "timestamp_granularities[]": "word"},
            ))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until the windows are in the engine
                counts = await asyncio.to_thread(engine_counts, server)
                if counts["running"] + counts["waiting"] > 0:
                    break
                await asyncio.sleep(0.05)
            assert not request.done(), "the request finished before the client could leave"
            request.cancel()  # closes the connection

    asyncio.run(post_then_disconnect())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        counts = engine_counts(server)
        stats = httpx.get(f"{server}/v1/audio/alignments/stats", timeout=30).json()
        if counts["running"] + counts["waiting"] == 0 and stats["tracked"] == 0 and stats["parked"] == 0:
            break
        time.sleep(0.5)
    assert counts["running"] + counts["waiting"] == 0, counts
    assert counts["aborted"] > before["aborted"], (before, counts)
    assert stats["tracked"] == 0 and stats["parked"] == 0, stats


def test_stream_without_timestamps_is_vllms_own_stream(server):
    clip = sentence_clips()[1]
    with httpx.stream(
        "POST", f"{server}/v1/audio/transcriptions",
        files={"file": ("c.wav", wav_bytes(clip), "audio/wav")},
        data={"model": "whisper-tiny.en", "stream": "true", "language": "en"}, timeout=300,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events if e != "[DONE]"]
    assert "glass" in "".join(deltas).lower()


def test_openapi_lists_alignment_route(server):
    schema = httpx.get(f"{server}/openapi.json", timeout=30).json()
    assert "/v1/audio/alignments" in schema["paths"]
    assert "/v1/audio/transcriptions" in schema["paths"]
