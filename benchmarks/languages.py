"""Word starts in other languages than English, for ``real_speech_bench.py --set languages``:
tests/support/languages.py's espeak-ng sentences in seven languages as clips of the real sets' kind,
scored with the real sets' rules.

Synthetic speech, and the only non-English speech with word times this project has: no PyPI package it
can reach ships non-English recordings with word-level truth (docs/real-speech-set.md#other-languages).
espeak-ng's voices for these languages are further from human speech than its English one, so Whisper
mishears many of their words: forced alignment, given the text, is the measure of placement here;
transcription's rows say more about hearing than about timing.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the speech helpers the tests use

from tests.support.languages import SENTENCES, VOICES, spoken  # noqa: E402
from tests.support.real_speech import Clip  # noqa: E402


def clips() -> list[Clip]:
    """Every sentence of every language as a clip of the real sets' kind (its kind and language: the
    language's code); word ends are unknown but the last (NaN), as are starts espeak-ng gave no event."""
    made = []
    for language in SENTENCES:
        for index, sentence in enumerate(spoken(language)):
            made.append(
                Clip(
                    id=f"espeak-{language}-{index}",
                    source="espeak-ng",
                    path=f"voice {VOICES[language]}",
                    kind=language,
                    kind_basis="the sentence's language",
                    samples=sentence.samples,
                    words=sentence.words,
                    starts=sentence.starts,
                    ends=sentence.ends,
                    filled=[False] * len(sentence.words),
                    text=sentence.text,
                    truth_source="espeak-ng",
                    trust="exact (libespeak-ng's word events)",
                    levels={},
                    language=language,
                )
            )
    return made
