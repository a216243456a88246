"""What the server accepts: the longest audio and the largest upload, from its environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

MAX_AUDIO_ENV = "VLLM_WHISPER_ALIGN_MAX_AUDIO_S"


@dataclass(frozen=True)
class ServerLimits:
    max_audio_s: float = 3600.0
    max_file_mb: float = 25.0

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * 2**20)

    @classmethod
    def from_env(cls) -> ServerLimits:
        from vllm import envs

        return cls(
            max_audio_s=float(os.environ.get(MAX_AUDIO_ENV, cls.max_audio_s)),
            max_file_mb=float(envs.VLLM_MAX_AUDIO_CLIP_FILESIZE_MB),
        )
