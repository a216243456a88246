"""A multilingual model (base, converted from its two-part CTranslate2 wheel) behind the server."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest

from tests.support.speech import sentence_clips, write_wav


@pytest.fixture(scope="module")
def base_server(tmp_path_factory):
    from tests.support.servers import running_server
    from vllm_whisper_align.checkpoints.bundled import base_model_path

    with running_server(base_model_path(), tmp_path_factory.mktemp("base"), "whisper-base") as url:
        yield url


@pytest.fixture(scope="module")
def base_client(base_server):
    return openai.OpenAI(base_url=f"{base_server}/v1", api_key="unused", timeout=600)


def wav(clip) -> bytes:
    buffer = io.BytesIO()
    write_wav(buffer, clip.samples)
    return buffer.getvalue()


def test_detects_language_and_gives_words(base_client):
    clip = sentence_clips()[1]
    result = base_client.audio.transcriptions.create(
        model="whisper-base",
        file=("c.wav", wav(clip)),
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
        file=("c.wav", wav(clip)),
        language="en",
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert given.words and given.language == "en"
    translated = base_client.audio.translations.create(
        model="whisper-base", file=("c.wav", wav(clip)), response_format="verbose_json"
    )
    assert translated.text.strip()
    with pytest.raises(openai.BadRequestError):
        base_client.audio.transcriptions.create(
            model="whisper-base", file=("c.wav", wav(clip)), language="xx"
        )
