"""What the server accepts: the longest audio, the largest upload, how long a body (or a live stream) may
stall, how many live streams may be open; from its environment. And how long it keeps an idle
connection open, which ``serve`` sets in that environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

MAX_AUDIO_ENV = "VLLM_WHISPER_ALIGN_MAX_AUDIO_S"
BODY_IDLE_ENV = "VLLM_WHISPER_ALIGN_BODY_IDLE_S"
MAX_LIVE_STREAMS_ENV = "VLLM_WHISPER_ALIGN_MAX_LIVE_STREAMS"
# vLLM's HTTP server (uvicorn) closes a connection left idle this long after a response. vLLM's default,
# 5 s, is also how long httpx's pool (the openai client's) keeps an idle connection: a client reusing one
# idle for about 5 s sends its request while the server closes it, and loses it (a ReadError, with
# nothing in the server's log). Longer than common clients' pools keep theirs (httpx 5 s, aiohttp 15 s,
# Go 90 s), so that the client is the one to close.
KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
KEEP_ALIVE_S = 120


@dataclass(frozen=True)
class ServerLimits:
    max_audio_s: float = 3600.0
    max_file_mb: float = 25.0
    # Longest wait for the next chunk of a request body before the request is refused (408), and for
    # the next message of a live stream with nothing of it being decoded before it is closed.
    body_idle_s: float = 30.0
    # Live streams open at once (/v1/realtime); None: as many as one engine batch decodes together
    # (``runners.live.LiveStreams``).
    max_live_streams: int | None = None

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * 2**20)

    @classmethod
    def from_env(cls) -> ServerLimits:
        from vllm import envs

        return cls(
            max_audio_s=float(os.environ.get(MAX_AUDIO_ENV, cls.max_audio_s)),
            max_file_mb=float(envs.VLLM_MAX_AUDIO_CLIP_FILESIZE_MB),
            body_idle_s=float(os.environ.get(BODY_IDLE_ENV, cls.body_idle_s)),
            max_live_streams=_positive_int(MAX_LIVE_STREAMS_ENV),
        )


def _positive_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{name}={value!r}: a whole number of at least 1 is needed")
    return int(value)


def http_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """vLLM's HTTP settings ``serve`` starts its server with, minus those already set (the user's win)."""
    return {} if KEEP_ALIVE_ENV in environ else {KEEP_ALIVE_ENV: str(KEEP_ALIVE_S)}
