"""Whisper's special tokens and decoder prompts, read from whatever tokenizer vLLM loaded.

English-only (``*.en``) models have no language or task tokens: their prompt is
``<|startoftranscript|><|notimestamps|>``. Giving them the multilingual prompt (as vLLM 0.32 does)
makes them emit nothing or garbage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_whisper_align.constants import MAX_DECODER_TOKENS
from vllm_whisper_align.errors import InputError

# Whisper's English-only vocabularies have 51864 ids; multilingual ones 51865 (large-v3: 51866).
# English-only vocabularies still list language tokens, but the model was never trained with them.
ENGLISH_ONLY_VOCAB_SIZE = 51864
# The start of an English-only model's decoder prompt: no language, no task.
ENGLISH_ONLY_START = ("<|startoftranscript|>", "<|notimestamps|>")
# Whisper's no-speech token, renamed in later tokenizers.
NO_SPEECH_NAMES = ("<|nospeech|>", "<|nocaptions|>")


def is_english_only_vocab(vocab_size: int) -> bool:
    """The one rule for English-only (``*.en``) models: the model's vocabulary size."""
    return vocab_size <= ENGLISH_ONLY_VOCAB_SIZE


@dataclass(frozen=True)
class WhisperTokens:
    eot: int
    sot: int
    transcribe: int
    translate: int
    no_timestamps: int
    start_of_prev: int
    timestamp_begin: int | None
    # The token whose probability after <|startoftranscript|> is openai-whisper's no_speech_prob.
    no_speech: int | None = None
    language_ids: dict[str, int] = field(default_factory=dict)
    vocab_size: int = 0
    english_only_start: tuple[int, ...] = ()
    # The most characters one token stands for (None: unknown): bounds how many tokens a text has
    # before it is tokenized, which takes seconds for a megabyte.
    max_token_chars: int | None = None
    decode_ids: Callable[[list[int]], str] | None = field(default=None, compare=False, repr=False)
    encode_text: Callable[[str], list[int]] | None = field(default=None, compare=False, repr=False)

    @property
    def is_multilingual(self) -> bool:
        return bool(self.language_ids)

    @property
    def is_english_only(self) -> bool:
        return not self.language_ids

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, vocab_size: int) -> WhisperTokens:
        """Special tokens of ``tokenizer``; ``vocab_size`` is the model's (``hf_config.vocab_size``)."""

        def token_id(text: str) -> int | None:
            ids = tokenizer.convert_tokens_to_ids([text])
            value = ids[0] if ids else None
            unk = getattr(tokenizer, "unk_token_id", None)
            return None if value is None or (value == unk and text != "<|endoftext|>") else value

        languages = {}
        vocab = tokenizer.get_vocab()
        sot, translate = vocab["<|startoftranscript|>"], vocab["<|translate|>"]
        if not is_english_only_vocab(vocab_size):
            for text, index in vocab.items():
                # The language tokens sit between <|startoftranscript|> and <|translate|>.
                if sot < index < translate and text.startswith("<|") and text.endswith("|>"):
                    languages[text[2:-2]] = index
        return cls(
            eot=vocab["<|endoftext|>"],
            sot=sot,
            transcribe=vocab["<|transcribe|>"],
            translate=translate,
            no_timestamps=vocab["<|notimestamps|>"],
            start_of_prev=vocab["<|startofprev|>"],
            timestamp_begin=token_id("<|0.00|>"),
            no_speech=next((i for i in map(token_id, NO_SPEECH_NAMES) if i is not None), None),
            language_ids=languages,
            vocab_size=vocab_size,
            english_only_start=tuple(vocab[token] for token in ENGLISH_ONLY_START),
            # A byte-level BPE token's vocabulary entry holds one symbol per byte: no fewer than its
            # characters.
            max_token_chars=max(map(len, vocab)),
            decode_ids=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            # User text is plain text: "<|endoftext|>" in it is spelled out, never a control token.
            encode_text=lambda text: tokenizer.encode(
                text, add_special_tokens=False, split_special_tokens=True
            ),
        )

    def surely_longer(self, text: str, count: int) -> bool:
        """Whether ``text`` is more than ``count`` tokens, known from its length alone."""
        return self.max_token_chars is not None and len(text) > count * self.max_token_chars

    def tail(self, text: str, count: int) -> str:
        """The end of ``text`` that holds its last ``count`` tokens, without tokenizing the rest: cut
        where a word begins (a space before a letter, where the tokenizer starts a piece anyway), so
        that the tail's tokens are the text's, and in the first half of twice the characters ``count``
        tokens can take, so that what is left still holds them. Without a word start there (a run of
        characters with no space, as Chinese is written), the tail is cut inside the run: its first
        tokens differ from the text's, and on a long run of one character its last may too (a prompt,
        not worth a megabyte's tokenization on the event loop)."""
        if not self.surely_longer(text, 2 * count):
            return text
        tail = text[-2 * count * (self.max_token_chars or 0) :]
        first_half = range(len(tail) // 2)
        begins = next((i for i in first_half if tail[i] == " " and not tail[i + 1].isspace()), 0)
        return tail[begins:]

    def check_language(self, language: str | None, task: str = "transcribe") -> None:
        """An InputError naming this model's languages when it cannot ``task`` ``language`` (``param``:
        "model" where the model cannot do the task at all, else "language")."""
        if self.is_english_only:
            if language not in (None, "en"):
                raise InputError(
                    f"this English-only model transcribes English (language en) only; got language "
                    f"{language[:20]!r}",
                    "language",
                )
            if task == "translate":
                raise InputError("this English-only model cannot translate", "model")
        elif language is not None and language not in self.language_ids:
            raise InputError(
                f"unsupported language {language[:20]!r}; this model's languages: "
                f"{', '.join(sorted(self.language_ids))}",
                "language",
            )

    def transcription_prompt(self, language: str | None, task: str = "transcribe") -> list[int]:
        """The decoder prompt before the text: [sot, language, task, no_timestamps] (multilingual)
        or ``ENGLISH_ONLY_START`` (``*.en`` models)."""
        self.check_language(language, task)
        if self.is_english_only:
            return list(self.english_only_start)
        if language is None:
            raise ValueError("a multilingual model needs a language (detect it first)")
        task_id = self.translate if task == "translate" else self.transcribe
        return [self.sot, self.language_ids[language], task_id, self.no_timestamps]

    def alignment_room(self) -> int:
        """Text tokens that fit in a teacher-forced sequence (``alignment_prompt``) in the decoder: the
        start tokens, the text and eot, and the one token vLLM generates after a prompt (it refuses a
        prompt that fills the context). The start tokens are as many for every language (English's
        stand for all): a multilingual model's room is known before its language is."""
        return MAX_DECODER_TOKENS - len(self.transcription_prompt("en")) - 2

    def alignment_prompt(self, language: str | None, text_tokens: list[int]) -> list[int]:
        """The reference's teacher-forced sequence: [sot…, no_timestamps, text…, eot]."""
        return [*self.transcription_prompt(language), *text_tokens, self.eot]

    def is_text_token(self, token: int) -> bool:
        return 0 <= token < self.eot

    def decode(self, ids: list[int]) -> str:
        return self.decode_ids([t for t in ids if self.is_text_token(t)])

    def decode_with_special(self, ids: list[int]) -> str:
        return self.decode_ids(ids)

    def encode(self, text: str) -> list[int]:
        return self.encode_text(text)

    def encode_characters(self, text: str) -> list[int]:
        """``text`` as one token per character (more where a character takes several byte tokens);
        a word's first character keeps its leading space, so words still start at a space."""
        ids: list[int] = []
        for word in text.split():
            ids += self.encode(" " + word[0])
            for character in word[1:]:
                ids += self.encode(character)
        return ids
