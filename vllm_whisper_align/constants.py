"""Whisper's fixed geometry: its audio (as ``whisper/audio.py``) and its decoder context. Every other
module imports these; this one imports nothing.
"""

from __future__ import annotations

# Whisper's fixed audio geometry (as whisper/audio.py): every other module imports these.
SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160  # 10 ms mel hop: 100 frames per second of audio
CHUNK_SECONDS = 30  # one encoder window
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE  # 480000 samples in a window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a window
N_SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # the encoder's stride-2 convolution: one frame is 20 ms
TOKENS_PER_SECOND = SAMPLE_RATE // N_SAMPLES_PER_TOKEN  # 50 encoder frames per second
ENCODER_FRAMES = N_FRAMES // 2  # 1500 encoder frames in a window


def num_mel_frames(num_samples: int) -> int:
    """Number of mel frames Whisper computes for `num_samples` of content.

    Both openai-whisper (`transcribe`: padded mel length minus N_FRAMES) and the HF
    WhisperFeatureExtractor drop the last STFT frame of a centered STFT, which leaves
    floor(num_samples / HOP_LENGTH) frames, not ceil: a trailing partial hop has no frame.
    """
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    return num_samples // HOP_LENGTH


# Decoder context of every Whisper model; the forced-alignment prompt must fit in it.
MAX_DECODER_TOKENS = 448
