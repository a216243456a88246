"""Server memory under rounds of hostile and ordinary traffic: does anything stay behind?

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/memory_soak.py [--rounds 25]

Starts ``vllm-whisper-align serve`` (its defaults) and, after one warm-up request, runs rounds of: 20
live streams on /v1/realtime (4 s of real speech each, sent at 10x real time; half commit and read to
``transcription.done``, half close without a word), 16 streamed transcriptions (SSE) whose client goes
away after the first event, 24 plain verbose_json requests with word timestamps (8 at a time) and 15
bodies that are not audio. After each round (and 5 s of quiet) it prints the round's status codes, the
PSS of the server's process tree and the stats route's live buffers. A leak shows as PSS that climbs
round after round; live streams and buffered samples must read zero.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf
import websockets

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.support: the real recordings
sys.path.insert(0, str(HERE / "runners"))

from common import DEFAULT_VARIANT, cpu_description, tree_memory  # noqa: E402
from vllm_http_run import free_port, start_server, stop_server, wait_healthy  # noqa: E402

from tests.support import real_speech  # noqa: E402

MODEL = "whisper-tiny.en"
CHUNK_S = 0.2


def wav_bytes(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, 16000, format="WAV", subtype="PCM_16")
    return out.getvalue()


class Traffic:
    """One round's requests against ``url``, on ``samples`` (float32, 16 kHz)."""

    def __init__(self, url: str, samples: np.ndarray):
        self.url = url
        self.wav = wav_bytes(samples)
        self.pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()

    async def live(self, commit: bool) -> None:
        socket_url = self.url.replace("http://", "ws://") + "/v1/realtime"
        async with websockets.connect(socket_url, max_size=2**24) as socket:
            await socket.recv()  # session.created
            await socket.send(json.dumps({"type": "session.update", "model": MODEL}))
            step = int(CHUNK_S * 16000) * 2
            for at in range(0, min(len(self.pcm), 4 * 16000 * 2), step):
                chunk = base64.b64encode(self.pcm[at : at + step]).decode()
                await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
                await asyncio.sleep(CHUNK_S / 10)
            if commit:
                await socket.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
                while json.loads(await asyncio.wait_for(socket.recv(), 120))["type"] not in (
                    "transcription.done",
                    "error",
                ):
                    pass

    def form(self, **extra: str) -> dict:
        return {"response_format": "verbose_json", "timestamp_granularities[]": "word", **extra}

    async def streamed_then_gone(self, client: httpx.AsyncClient) -> None:
        files = {"file": ("clip.wav", self.wav, "audio/wav")}
        path = f"{self.url}/v1/audio/transcriptions"
        async with client.stream("POST", path, files=files, data=self.form(stream="true"), timeout=120) as r:
            async for _ in r.aiter_lines():
                break

    async def plain(self, client: httpx.AsyncClient, slots: asyncio.Semaphore) -> int:
        async with slots:
            files = {"file": ("clip.wav", self.wav, "audio/wav")}
            r = await client.post(
                f"{self.url}/v1/audio/transcriptions", files=files, data=self.form(), timeout=300
            )
            return r.status_code

    async def not_audio(self, client: httpx.AsyncClient) -> list[int]:
        codes = []
        for body in (b"not audio", b"RIFF\x00\x00", os.urandom(5000)):
            files = {"file": ("clip.wav", body, "audio/wav")}
            r = await client.post(
                f"{self.url}/v1/audio/transcriptions", files=files, data=self.form(), timeout=60
            )
            codes.append(r.status_code)
        return codes

    async def round(self, client: httpx.AsyncClient) -> tuple[list[int], list[int]]:
        await asyncio.gather(*[self.live(commit=index % 2 == 0) for index in range(20)])
        await asyncio.gather(*[self.streamed_then_gone(client) for _ in range(16)])
        slots = asyncio.Semaphore(8)
        served = await asyncio.gather(*[self.plain(client, slots) for _ in range(24)])
        refused = [code for _ in range(5) for code in await self.not_audio(client)]
        return sorted(set(served)), sorted(set(refused))


def pss_mib(pid: int) -> float:
    return round(sum(row["pss_mib"] for row in tree_memory(pid)), 1)


async def soak(url: str, pid: int, rounds: int, samples: np.ndarray) -> None:
    traffic = Traffic(url, samples)
    async with httpx.AsyncClient() as client:
        await traffic.plain(client, asyncio.Semaphore(1))
        print(f"after warm-up: PSS {pss_mib(pid)} MiB", flush=True)
        for number in range(1, rounds + 1):
            started = time.monotonic()
            served, refused = await traffic.round(client)
            await asyncio.sleep(5)
            stats = (await client.get(f"{url}/v1/audio/alignments/stats")).json()
            live = {key: value for key, value in stats.items() if key.startswith("live")}
            print(
                f"round {number}: {time.monotonic() - started:.0f} s, served {served}, refused {refused}, "
                f"PSS {pss_mib(pid)} MiB, {live}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    clips = real_speech.load_clips(log=lambda *_: None)
    samples = np.concatenate([clip.samples for clip in clips[:6]]).astype(np.float32)
    print(
        f"{cpu_description()}, {os.cpu_count()} CPUs; {len(samples) / 16000:.1f} s of real speech", flush=True
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # serve's defaults (32 sequences is its own default, written out by the shared starter)
    server = start_server(None, DEFAULT_VARIANT, 32, port, HERE / "out" / "memory_soak_serve.log")
    try:
        wait_healthy(url, server)
        asyncio.run(soak(url, server.pid, args.rounds, samples))
    finally:
        stop_server(server)


if __name__ == "__main__":
    main()
