"""A model's tokens as the runners build them: its tokenizer and vocabulary size, read from its dir."""

from __future__ import annotations

import functools
from pathlib import Path

from vllm_whisper_align.tokens import WhisperTokens


@functools.cache
def whisper_tokens(model_dir: str | Path) -> WhisperTokens:
    from transformers import AutoConfig, AutoTokenizer

    vocab_size = AutoConfig.from_pretrained(model_dir).vocab_size
    return WhisperTokens.from_tokenizer(AutoTokenizer.from_pretrained(model_dir), vocab_size)
