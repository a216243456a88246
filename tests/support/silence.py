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


def write_silent_flac(path, seconds: float, sample_rate: int, channels: int = 1) -> None:
    """`seconds` of 16-bit silence."""
    remaining = int(seconds * sample_rate)
    block = np.zeros((min(WRITE_BLOCK // channels, remaining), channels), dtype=np.float32)
    with soundfile.SoundFile(path, "w", sample_rate, channels, format="FLAC", subtype="PCM_16") as output:
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


# write_constant_flac: FLAC's frame header codes (the format's spec, "FRAME_HEADER").
FLAC_SYNC = b"\xff\xf8"  # sync code, fixed block size
BLOCK_SIZE_FROM_END = 0b0111  # a 16-bit (block size - 1) follows the frame number
RATE_CODES = {
    8000: 0b0100,
    16000: 0b0101,
    22050: 0b0110,
    24000: 0b0111,
    32000: 0b1000,
    44100: 0b1001,
    48000: 0b1010,
    96000: 0b1011,
}
SIXTEEN_BITS = 0b100


def write_constant_flac(path, seconds: float, sample_rate: int, channels: int, block: int = 32768) -> None:
    """Digital silence as FLAC's CONSTANT subframes, written directly (no encoder: hours of many
    channels in a fraction of a second), with no length in the header (as a streaming encoder writes)
    and ``block`` samples a frame: a few bytes a frame whatever the rate and channels. What a
    decompression bomb looks like; libsndfile and FFmpeg decode it as any FLAC."""
    frames = int(seconds * sample_rate) // block
    info = bytearray()
    info += block.to_bytes(2, "big") * 2  # min and max block size
    info += bytes(6)  # min and max frame size: unknown
    packed = (sample_rate << 44) | ((channels - 1) << 41) | (15 << 36)  # rate, channels, 16 bits, 0 samples
    info += packed.to_bytes(8, "big") + bytes(16)  # MD5: unknown
    with open(path, "wb") as file:
        file.write(b"fLaC" + bytes([0x80, 0, 0, len(info)]) + info)  # the last metadata block: STREAMINFO
        for number in range(frames):
            header = bytearray(FLAC_SYNC)
            header.append(BLOCK_SIZE_FROM_END << 4 | RATE_CODES[sample_rate])
            header.append((channels - 1) << 4 | SIXTEEN_BITS << 1)
            header += _utf8_number(number) + (block - 1).to_bytes(2, "big")
            header.append(_crc8(header))
            frame = header + bytes(3 * channels)  # each channel: a CONSTANT subframe of value 0
            file.write(frame + _crc16(frame).to_bytes(2, "big"))


def _utf8_number(number: int) -> bytes:
    """A frame number as FLAC writes it: UTF-8's coding of the number (up to 31 bits here)."""
    if number < 0x80:
        return bytes([number])
    return chr(number).encode("utf-8", "surrogatepass") if number < 0x110000 else _long_utf8(number)


def _long_utf8(number: int) -> bytes:
    tail = []
    while number >= 0x40 >> len(tail) or not tail:
        tail.insert(0, 0x80 | (number & 0x3F))
        number >>= 6
    lead = (0xFF << (7 - len(tail))) & 0xFF
    return bytes([lead | number, *tail])


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc
