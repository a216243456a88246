"""What the server accepts: the longest audio, the largest upload, how long a body may stall; from its
environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

MAX_AUDIO_ENV = "VLLM_WHISPER_ALIGN_MAX_AUDIO_S"
BODY_IDLE_ENV = "VLLM_WHISPER_ALIGN_BODY_IDLE_S"


@dataclass(frozen=True)
class ServerLimits:
    max_audio_s: float = 3600.0
    max_file_mb: float = 25.0
    # Longest wait for the next chunk of a request body before the request is refused (408).
    body_idle_s: float = 30.0

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
        )
