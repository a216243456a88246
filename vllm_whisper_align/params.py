"""The alignment parameters a request carries to the engine.

They travel in ``SamplingParams.extra_args[EXTRA_ARGS_KEY]`` as a plain dict, because that is the one
per-request channel vLLM forwards untouched from the API process to the model runner (it is msgpack
serialised on the way, so only plain types go in it).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

EXTRA_ARGS_KEY = "whisper_align"

# Decoder context of every Whisper model; the forced-alignment prompt must fit in it.
MAX_DECODER_TOKENS = 448
# One 30 s window of log-mel frames (hop 10 ms).
MAX_MEL_FRAMES = 3000


def new_alignment_key() -> str:
    return uuid.uuid4().hex


@dataclass
class AlignmentParams:
    """Asks the engine to capture cross-attention for one request.

    The capture is keyed by ``key`` rather than by vLLM's request id, because the engine appends a
    random suffix to the id the caller chose; the caller keeps ``key`` to fetch the timings.
    """

    # Mel frames of the real (unpadded) audio; softmax runs over num_frames // 2 encoder frames.
    num_frames: int
    # Decoder row of <|startoftranscript|>: rows before it (a <|startofprev|> prompt) are not
    # part of the reference's normalisation.
    sot_row: int = 0
    # Decoder row whose output predicts the first text token (the <|notimestamps|> row).
    text_row: int = 1
    key: str = field(default_factory=new_alignment_key)
    medfilt_width: int = 7
    qk_scale: float = 1.0

    def validate(self) -> None:
        if not 0 < self.num_frames <= MAX_MEL_FRAMES:
            raise ValueError(
                f"num_frames must be in 1..{MAX_MEL_FRAMES} (one 30 s window), got {self.num_frames}"
            )
        if not 0 <= self.sot_row < self.text_row < MAX_DECODER_TOKENS:
            raise ValueError(f"need 0 <= sot_row < text_row < {MAX_DECODER_TOKENS}")
        if self.medfilt_width < 1 or self.medfilt_width % 2 == 0:
            raise ValueError("medfilt_width must be a positive odd number")

    def to_extra_args(self, extra_args: dict[str, Any] | None = None) -> dict[str, Any]:
        self.validate()
        merged = dict(extra_args or {})
        merged[EXTRA_ARGS_KEY] = asdict(self)
        return merged

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> AlignmentParams | None:
        if not extra_args or EXTRA_ARGS_KEY not in extra_args:
            return None
        return cls(**extra_args[EXTRA_ARGS_KEY])


@dataclass
class AlignmentRequest:
    """What the API side asks the worker for once a request has produced its tokens.

    ``num_text_tokens`` says how many rows after ``text_row`` belong to the text: the engine may have
    fed one more row than that (async scheduling runs a finished request once more), and a request
    cut by max_tokens never feeds its last token.
    """

    key: str
    num_text_tokens: int
