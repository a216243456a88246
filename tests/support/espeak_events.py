"""libespeak-ng through ctypes: a whole sentence spoken continuously, with each word's start sample.

The espeak-ng command line can only give word boundaries with pauses (one word per call). Its C
library reports an ``espeakEVENT_WORD`` for every word it speaks, with the sample where the word's
sound begins (``espeak_EVENT.sample``, at the library's 22050 Hz), so a sentence spoken in one
breath still has exact word starts. espeak-ng speaks some short words together with their
neighbour ("on the" becomes one unit): those get no event, and their start is reported as NaN.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

# espeak_AUDIO_OUTPUT / espeak_EVENT_TYPE / espeak_PARAMETER / espeak_POSITION_TYPE (speak_lib.h)
AUDIO_OUTPUT_SYNCHRONOUS = 2
EVENT_LIST_TERMINATED = 0
EVENT_WORD = 1
PARAMETER_RATE = 1
POSITION_CHARACTER = 1


class _Event(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # 1-based character offset of the word in the text
        ("length", ctypes.c_int),  # characters of the word
        ("audio_position", ctypes.c_int),  # milliseconds
        ("sample", ctypes.c_int),  # sample index at the library's rate
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_void_p),
    ]


_Callback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)
# The library keeps one global synthesizer: one sentence at a time per process.
_LOCK = threading.Lock()


@functools.cache
def _library() -> tuple[ctypes.CDLL, int]:
    library = ctypes.CDLL("libespeak-ng.so.1")
    sample_rate = library.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, None, 0)
    if sample_rate <= 0:
        raise RuntimeError("espeak_Initialize failed")
    return library, sample_rate


def speak_sentence(
    text: str, voice: str = "en-us", rate: int = 160
) -> tuple[np.ndarray, int, list[tuple[int, int]]]:
    """(int16 samples, sample rate, [(character offset, start sample)] per WORD event) for ``text``."""
    library, sample_rate = _library()
    chunks: list[np.ndarray] = []
    events: list[tuple[int, int]] = []

    def receive(wav, num_samples, event_list):
        if num_samples > 0:
            chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        index = 0
        while event_list[index].type != EVENT_LIST_TERMINATED:
            event = event_list[index]
            if event.type == EVENT_WORD:
                events.append((event.text_position - 1, event.sample))
            index += 1
        return 0

    callback = _Callback(receive)  # kept alive until synthesis returns
    encoded = text.encode("utf-8")
    with _LOCK:
        library.espeak_SetSynthCallback(callback)
        if library.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r}")
        library.espeak_SetParameter(PARAMETER_RATE, rate, 0)
        library.espeak_Synth(encoded, len(encoded) + 1, 0, POSITION_CHARACTER, 0, 0, None, None)
        library.espeak_Synchronize()
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16), sample_rate, events


def word_starts(text: str, events: list[tuple[int, int]], sample_rate: int) -> list[float]:
    """Seconds at which each space-separated word of ``text`` starts; NaN where espeak-ng gave no event."""
    offsets, position = [], 0
    for word in text.split():
        position = text.index(word, position)
        offsets.append(position)
        position += len(word)
    by_offset = {offset: sample for offset, sample in events}
    return [by_offset[offset] / sample_rate if offset in by_offset else float("nan") for offset in offsets]
