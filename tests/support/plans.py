"""Planning helpers for tests of the decoding policy on placeholder audio (zeros, noise)."""

from __future__ import annotations

from vllm_whisper_align.audio.windows import audible_windows
from vllm_whisper_align.runners import decoding


def every_window_planned(samples, tokens, **kwargs) -> decoding.Plan:
    """``decoding.plan_transcription`` over every audible window, speech or not: the policy under test
    is the same whatever the audio holds, and the placeholder audio holds no speech."""
    return decoding.plan_transcription(samples, tokens, windows=audible_windows(samples), **kwargs)
