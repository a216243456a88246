"""The given text's words and each window's heard words, grouped exactly as the alignment groups
tokens into words, and normalised for matching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_whisper_align.align.words import Word, merge_punctuations, normalise, split_to_word_tokens
from vllm_whisper_align.tokens import WhisperTokens

# ---------------------------------------------------------------------------- words


@dataclass
class TextWord:
    text: str
    tokens: list[int]
    key: str  # normalised for matching: case-folded, without punctuation or spaces


def text_words(token_ids: Sequence[int], tokens: WhisperTokens, language: str) -> list[TextWord]:
    """Words of a token sequence exactly as the alignment groups them (``align.words``' split and
    punctuation merge), so a window's result words line up one to one with its share."""
    if not token_ids:
        return []
    words, groups = split_to_word_tokens(
        [*token_ids, tokens.eot], tokens.decode_with_special, tokens.eot, language
    )
    timings = [Word(0.0, 0.0, w, 0.0, g) for w, g in zip(words[:-1], groups[:-1], strict=True)]
    merge_punctuations(timings)
    return [TextWord(t.word, t.tokens, normalise(t.word)) for t in timings]


def heard_words(text: str, tokens: WhisperTokens, language: str) -> list[TextWord]:
    """Words of a window's transcript, grouped as the given text's words are."""
    if not text.strip():
        return []
    return text_words(tokens.encode(" " + text.strip()), tokens, language)
