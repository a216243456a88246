"""A multilingual model (base, converted from its two-part CTranslate2 wheel) behind the server."""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest

from tests.support import languages
from tests.support.servers import forced_at_once, wav_bytes
from tests.support.speech import sentence_clips, start_errors, synthesize_words, word_errors


@pytest.fixture(scope="module")
def base_server(tmp_path_factory):
    from tests.support.servers import running_server
    from vllm_whisper_align.checkpoints.bundled import base_model_path

    with running_server(base_model_path(), tmp_path_factory.mktemp("base"), "whisper-base") as url:
        yield url


@pytest.fixture(scope="module")
def base_client(base_server):
    return openai.OpenAI(base_url=f"{base_server}/v1", api_key="unused", timeout=600)


def test_detects_language_and_gives_words(base_client):
    clip = sentence_clips()[1]
    result = base_client.audio.transcriptions.create(
        model="whisper-base",
        file=("c.wav", wav_bytes(clip)),
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert result.language == "en"
    heard = [w.word.strip(" .").lower() for w in result.words]
    assert sum(w in heard for w in clip.words) >= len(clip.words) - 1
    starts = np.array([w.start for w in result.words])
    assert np.all(np.diff(starts) >= 0)


def test_explicit_language_and_translation(base_client):
    clip = sentence_clips()[5]
    given = base_client.audio.transcriptions.create(
        model="whisper-base",
        file=("c.wav", wav_bytes(clip)),
        language="en",
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert given.words and given.language == "en"
    translated = base_client.audio.translations.create(
        model="whisper-base", file=("c.wav", wav_bytes(clip)), response_format="verbose_json"
    )
    assert translated.text.strip()
    with pytest.raises(openai.BadRequestError):
        base_client.audio.transcriptions.create(
            model="whisper-base", file=("c.wav", wav_bytes(clip)), language="xx"
        )


def test_requests_in_two_languages_at_once_keep_their_languages(base_client):
    """English and German clips sent together, each with its language: clips of one language may share
    a window, never clips of two; each answer is in its own language, with its own words."""
    english = sentence_clips()[:6]
    german = [synthesize_words(words.split(), voice="de") for words in GERMAN]

    async def send_all():
        client = openai.AsyncOpenAI(
            base_url=str(base_client.base_url), api_key="unused", timeout=600, max_retries=0
        )
        try:
            return await asyncio.gather(
                *(
                    client.audio.transcriptions.create(
                        model="whisper-base",
                        file=("c.wav", wav_bytes(clip)),
                        language=language,
                        response_format="verbose_json",
                        timestamp_granularities=["word"],
                    )
                    for clip, language in [*((c, "en") for c in english), *((c, "de") for c in german)]
                )
            )
        finally:
            await client.close()

    results = asyncio.run(send_all())
    assert [r.language for r in results] == ["en"] * len(english) + ["de"] * len(german)
    for k, (clip, result) in enumerate(zip([*english, *german], results, strict=True)):
        assert result.words, clip.text
        # nearer its own sentence than any of the other language's (base hears espeak's German poorly)
        heard = [w.word.strip(" .,").lower() for w in result.words]
        others = german if k < len(english) else english
        own = word_errors([w.lower() for w in clip.words], heard)
        assert own < min(word_errors([w.lower() for w in c.words], heard) for c in others), (
            clip.text,
            result.text,
        )


# base hears espeak's German word by word poorly: "wir trinken heute Abend Kaffee" comes back as
# "Riechen, Pfeuter, Arbent, Café", packed or alone; these two it hears.
GERMAN = ["der Hund spielt im Garten", "guten Morgen wie geht es dir"]


def test_base_places_real_speech_starts(base_server, real_clips):
    """A window of base reads as many heads as base has tuned ones (8 of its 24-head pool), not half the
    pool: forced alignment of the real recordings placed 64.5% of starts within 50 ms with 8, 60.9% with
    12 (docs/boundaries.md#how-many-heads-base-2026-12-05; 2 words of margin here)."""
    results = forced_at_once(base_server, real_clips, language="en", response_format="verbose_json")
    starts = np.concatenate([start_errors(c, r["words"]) for c, r in zip(real_clips, results, strict=True)])
    assert np.isfinite(starts).all()
    assert np.mean(starts <= 0.05) >= 0.63


def test_base_places_german_words_by_its_heads(base_server):
    """German has no acoustic model here: its words keep the selected heads' times and the boundary
    rules'. Forced through the server, the German sentences of tests/support/languages.py (continuous
    espeak-ng speech, exact starts): 82.6% of starts within 50 ms offline with the default, 62.3% with
    the tuned heads alone (`fixed`); the default must keep most of that lead (benchmarks/RESULTS.md, word
    starts in other languages)."""
    german = languages.spoken("de")

    def within_50ms(method: str) -> float:
        results = forced_at_once(
            base_server, german, language="de", alignment_method=method, response_format="json"
        )
        errors = np.concatenate([start_errors(c, r["words"]) for c, r in zip(german, results, strict=True)])
        known = errors[~np.isnan(errors)]  # a start espeak-ng gave no event for is not judged
        assert np.isfinite(known).all()  # every given word comes back
        return float(np.mean(known <= 0.05))

    default, fixed = within_50ms("auto"), within_50ms("fixed")
    assert default >= 0.75, (default, fixed)
    assert default >= fixed + 0.1, (default, fixed)
