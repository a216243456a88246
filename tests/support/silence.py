"""Long silent FLAC files, small on disk, for duration limits: FLAC stores silence in a few bytes
a second, so hours of it upload in well under the size limit."""

import numpy as np
import soundfile

# Samples written per call: ten minutes at 16 kHz, so writing hours holds little memory.
WRITE_BLOCK = 10 * 60 * 16000
# STREAMINFO starts after "fLaC" and a 4-byte block header; its total sample count is the low
# 36 bits of the 8 bytes at offset 10 in it (after the sample rate, channels and bit depth).
TOTAL_SAMPLES_OFFSET = 8 + 10
TOTAL_SAMPLES_MASK = (1 << 36) - 1


def write_silent_flac(path, seconds: float, sample_rate: int) -> None:
    """`seconds` of 16-bit mono silence."""
    remaining = int(seconds * sample_rate)
    block = np.zeros(min(WRITE_BLOCK, remaining), dtype=np.float32)
    with soundfile.SoundFile(path, "w", sample_rate, 1, format="FLAC", subtype="PCM_16") as output:
        while remaining > 0:
            output.write(block[:remaining])
            remaining -= len(block)


def state_total_samples(path, total: int) -> None:
    """Replace the sample count in a FLAC's header: 0 is FLAC's "unknown" (as streaming encoders
    write), a count below the real one is a header that lies."""
    with open(path, "r+b") as file:
        header = bytearray(file.read(TOTAL_SAMPLES_OFFSET + 8))
        assert header[:4] == b"fLaC"
        packed = int.from_bytes(header[TOTAL_SAMPLES_OFFSET:], "big")
        packed = (packed & ~TOTAL_SAMPLES_MASK) | (total & TOTAL_SAMPLES_MASK)
        file.seek(TOTAL_SAMPLES_OFFSET)
        file.write(packed.to_bytes(8, "big"))
