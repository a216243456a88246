"""The options of a transcription or an alignment, written once: each is an :class:`Option` (name, kind,
default, range, help), from which the HTTP form fields and their schema (``server.forms``), the CLI's
flags (``cli``) and the Python API's keyword arguments (``runners.offline``) are derived and checked,
with one set of messages. :class:`TranscriptionOptions` and :class:`AlignmentOptions` hold the values
a request runs with; :class:`SubtitleOptions` the line controls of srt and vtt output.

Also here, as the facts those options are about: the alignment methods (:class:`AlignmentMethod`),
openai-whisper's temperature fallback and silence thresholds (:class:`FallbackOptions`), and the gzip
compression ratio they read.
"""

from __future__ import annotations

import difflib
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from vllm_whisper_align.constants import MAX_DECODER_TOKENS
from vllm_whisper_align.errors import OptionError

# Longest quotation of a caller's value in a message: messages never echo large inputs.
ECHO_CHARS = 80


def echo(value: Any) -> str:
    """A caller's value quoted in an error message, cut short."""
    shown = repr(value)
    return shown if len(shown) <= ECHO_CHARS else shown[: ECHO_CHARS - 1] + "…"


# ---------------------------------------------------------------------------- alignment methods


@dataclass(frozen=True)
class AlignmentMethod:
    """How word times are read from the captured heads, and what the words' boundaries go through."""

    name: str
    description: str
    # Per window, the heads whose attention is sharpest (align.timing.select_heads); else the model's
    # tuned alignment heads.
    selects_heads: bool
    # The heads move on as soon as a word's sound ends (align.boundaries.snap_to_speech's
    # neighbour_sound): true of the selected heads and of characters, not of the tuned heads on text.
    leaves_words_early: bool
    # Starts moved to onsets and ends through quiet tails (align.boundaries).
    refines_boundaries: bool
    # The text is forced one character per token (forced alignment of one window only).
    forces_characters: bool = False
    # Then an acoustic model of phones places the words, where the language has one (audio.phones).
    places_phones: bool = False

    @property
    def transcribes(self) -> bool:
        """Whether transcription can read times this way (characters need the text beforehand)."""
        return not self.forces_characters

    @property
    def spans_windows(self) -> bool:
        """Whether long-form alignment can use it: a long text's split over windows counts the given
        words' tokens, which characters would not keep."""
        return not self.forces_characters


METHODS = {
    method.name: method
    for method in (
        AlignmentMethod(
            "auto",
            "per-window heads and boundary rules, then English words placed by an acoustic model of "
            "phones (default)",
            selects_heads=True,
            leaves_words_early=True,
            refines_boundaries=True,
            places_phones=True,
        ),
        AlignmentMethod(
            "heads",
            "per-window heads and boundary rules only (auto without the acoustic model)",
            selects_heads=True,
            leaves_words_early=True,
            refines_boundaries=True,
        ),
        AlignmentMethod(
            "fixed",
            "the model's tuned alignment heads, as openai-whisper",
            selects_heads=False,
            leaves_words_early=False,
            refines_boundaries=False,
        ),
        # Yeh et al.'s character-level teacher forcing on the tuned heads: sharper on base's continuous
        # speech; onsets and tails moved its boundaries the wrong way.
        AlignmentMethod(
            "characters",
            "the text forced one character per token; audio up to 30 s",
            selects_heads=False,
            leaves_words_early=True,
            refines_boundaries=False,
            forces_characters=True,
        ),
    )
}
DEFAULT_ALIGNMENT_METHOD = "auto"
TRANSCRIPTION_METHODS = tuple(name for name, method in METHODS.items() if method.transcribes)
ALIGNMENT_METHODS = tuple(METHODS)


def method_named(name: str) -> AlignmentMethod:
    """The method called ``name``; an OptionError naming the choices otherwise."""
    method = METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise OptionError(
            f"`alignment_method` must be one of {', '.join(METHODS)}; got {echo(name)}", "alignment_method"
        )
    return method


# ---------------------------------------------------------------------------- openai-whisper's fallback

# openai-whisper's transcribe defaults: the temperature schedule (its CLI's increment on fallback, up
# to 1.0) and the thresholds that make a window fall back, or count as silence.
TEMPERATURE_INCREMENT = 0.2
MAX_TEMPERATURE = 1.0
COMPRESSION_RATIO_THRESHOLD = 2.4
LOGPROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6
# Candidates sampled per window at a temperature above 0, the likeliest kept. One by default, as
# openai-whisper's transcribe() (its CLI and faster-whisper sample 5): on the benchmark clips, 5 took
# the default server from 24.3 to 14.5 audio-s per wall-s (benchmarks/RESULTS.md); --best-of 5 is
# the CLI's behaviour.
BEST_OF = 1
MAX_BEST_OF = 20


def temperature_schedule(start: float = 0.0) -> tuple[float, ...]:
    """The temperatures a window is tried at, as openai-whisper's CLI builds them from
    ``--temperature``: ``start`` and steps of 0.2 up to 1.0 (only ``start`` above 1.0)."""
    if not start <= MAX_TEMPERATURE:  # above 1.0, or not a number (the temperature option says so)
        return (start,)
    count = int((MAX_TEMPERATURE - start) / TEMPERATURE_INCREMENT + 1e-6) + 1
    return tuple(round(start + i * TEMPERATURE_INCREMENT, 6) for i in range(count))


def compression_ratio(text: str) -> float:
    """openai-whisper's gzip compression ratio of a text (repetitive text compresses well)."""
    text_bytes = text.encode("utf-8")
    return len(text_bytes) / max(1, len(zlib.compress(text_bytes)))


@dataclass(frozen=True)
class FallbackOptions:
    """openai-whisper's ``transcribe`` options for retrying and dropping windows (None turns a
    threshold off, as there)."""

    temperatures: tuple[float, ...] = temperature_schedule()
    compression_ratio_threshold: float | None = COMPRESSION_RATIO_THRESHOLD
    logprob_threshold: float | None = LOGPROB_THRESHOLD
    no_speech_threshold: float | None = NO_SPEECH_THRESHOLD
    # Candidates sampled at each temperature above 0; the likeliest is kept (runners.decoding.keep_best).
    best_of: int = BEST_OF
    # Once a window fails its first temperature, every later one decoded together instead of one after
    # another, the first that passes kept as in order: the same answer in one engine round trip more,
    # not up to five, for the decodes of the temperatures it would not have reached; a runner that sees
    # them finish one by one aborts those after one that passes (runners.driver.decode_windows).
    at_once: bool = False

    @classmethod
    def starting_at(cls, temperature: float = 0.0, **options: Any) -> FallbackOptions:
        return cls(temperature_schedule(temperature), **options)


# ---------------------------------------------------------------------------- one option


@dataclass(frozen=True)
class Option:
    """One option: its name (the Python keyword and the HTTP form field; the CLI flag is the name with
    dashes), kind, default, inclusive range or choices, and help."""

    name: str
    kind: type  # float, int, str or bool
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    # The lowest value is excluded (a penalty of 0, a top_p of 0 are no distribution).
    low_open: bool = False
    choices: tuple[str, ...] | None = None
    # "none" (any case) turns it off: openai-whisper's thresholds.
    can_be_none: bool = False
    # Values outside [low, high] that mean something of their own (top_k's -1: all tokens).
    also: tuple[Any, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, raw: str) -> Any:
        """The value of ``raw`` text (a form field, a CLI argument), checked."""
        text = raw.strip()
        if self.can_be_none and text.lower() == "none":
            return None
        if self.kind is bool:
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise OptionError(f"`{self.name}` must be true or false; got {echo(raw)}", self.name)
            return lowered in ("true", "1", "yes")
        if self.kind is str:
            return self.check(raw)
        try:
            value = int(text) if self.kind is int else float(text)
        except ValueError:
            raise OptionError(f"`{self.name}` must be {self._what()}; got {echo(raw)}", self.name) from None
        return self.check(value)

    def check(self, value: Any) -> Any:
        """``value`` (a Python value) if it is of this option's kind and range; else an OptionError."""
        if value is None and (self.can_be_none or self.default is None):
            return None
        if self.kind is bool:
            if not isinstance(value, bool):
                raise OptionError(f"`{self.name}` must be true or false; got {echo(value)}", self.name)
            return value
        if self.kind is str:
            if not isinstance(value, str) or (self.choices is not None and value not in self.choices):
                raise OptionError(f"`{self.name}` must be {self._what()}; got {echo(value)}", self.name)
            return value
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not numeric or (self.kind is int and not float(value).is_integer()):
            raise OptionError(f"`{self.name}` must be {self._what()}; got {echo(value)}", self.name)
        value = int(value) if self.kind is int else float(value)
        if value in self.also:
            return value
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and value > self.high
        if not math.isfinite(value) or too_low or too_high:
            raise OptionError(f"`{self.name}` must be {self._what()}; got {echo(value)}", self.name)
        return value

    def _what(self) -> str:
        if self.kind is str:
            return f"one of {', '.join(self.choices)}" if self.choices else "a string"
        noun = "an integer" if self.kind is int else "a number"
        low = "" if self.low is None else f"{'over' if self.low_open else 'at least'} {self.low:g}"
        high = "" if self.high is None else f"at most {self.high:g}"
        bounds = " and ".join(filter(None, (low, high)))
        also = "".join(f" (or {value:g})" for value in self.also)
        none = " (or none)" if self.can_be_none else ""
        return f"{noun}{' ' + bounds if bounds else ''}{also}{none}"


def check_values(values: Mapping[str, Any], options: Iterable[Option]) -> dict[str, Any]:
    """``values`` (Python keyword arguments) checked against ``options``; an unknown name is an
    OptionError that names the option it resembles."""
    by_name = {option.name: option for option in options}
    unknown = [name for name in values if name not in by_name]
    if unknown:
        raise unknown_option(unknown[0], by_name)
    return {name: by_name[name].check(value) for name, value in values.items()}


def closest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name a mistyped ``name`` most resembles, if any does (the "did you mean" of every
    unknown option and form field)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return close[0] if close else None


def unknown_option(name: str, known: Iterable[str]) -> OptionError:
    close = closest_name(name, known)
    hint = f"; did you mean `{close}`?" if close else ""
    return OptionError(f"unknown option `{name[:ECHO_CHARS]}`{hint}", name[:ECHO_CHARS])


# ---------------------------------------------------------------------------- the option sets

# Seeds vLLM's own OpenAI protocol accepts (torch's int64).
SEED_RANGE = (-(2**63), 2**63 - 1)
# Whisper's vocabularies have at most 51866 ids: a top_k beyond any of them keeps every token.
MAX_TOP_K = 51866
# Thresholds past these never trigger (a window's text is at most 448 tokens: its gzip ratio stays far
# under 1000, its average log-probability far above -1000); `none` turns a threshold off.
MAX_COMPRESSION_RATIO = 1000.0
MAX_LOGPROB_MAGNITUDE = 1000.0
# Line controls past these are no control at all.
MAX_LINE_CHARS, MAX_LINES, MAX_LINE_WORDS = 10_000, 1_000, 1_000

# vLLM's SamplingParams fields a transcription may set (OpenAI's and vLLM's names); None: vLLM's default.
SAMPLING_OPTIONS = (
    Option(
        "top_p",
        float,
        None,
        "nucleus sampling: the smallest set of tokens this likely",
        0.0,
        1.0,
        low_open=True,
    ),
    Option("top_k", int, None, "sample among the k likeliest tokens (-1: all)", 1, MAX_TOP_K, also=(-1, 0)),
    Option("min_p", float, None, "drop tokens less likely than this times the likeliest", 0.0, 1.0),
    Option("seed", int, None, "seed of the sampled candidates", *SEED_RANGE),
    Option("frequency_penalty", float, None, "penalty on tokens by how often they appeared", -2.0, 2.0),
    Option("presence_penalty", float, None, "penalty on tokens that appeared", -2.0, 2.0),
    Option(
        "repetition_penalty", float, None, "penalty on repeated tokens (1: none)", 0.0, 2.0, low_open=True
    ),
    Option("max_completion_tokens", int, None, "text tokens a window may produce", 1, MAX_DECODER_TOKENS),
)
FALLBACK_OPTIONS = (
    Option(
        "temperature",
        float,
        0.0,
        "first temperature; a window that fails the thresholds is decoded "
        f"again {TEMPERATURE_INCREMENT} higher, up to {MAX_TEMPERATURE}",
        0.0,
        MAX_TEMPERATURE,
    ),
    Option(
        "compression_ratio_threshold",
        float,
        COMPRESSION_RATIO_THRESHOLD,
        "gzip ratio above which text is too repetitive (fall back)",
        0.0,
        MAX_COMPRESSION_RATIO,
        low_open=True,
        can_be_none=True,
    ),
    Option(
        "logprob_threshold",
        float,
        LOGPROB_THRESHOLD,
        "average log-probability below which text is too improbable (fall back)",
        -MAX_LOGPROB_MAGNITUDE,
        0.0,
        can_be_none=True,
    ),
    Option(
        "no_speech_threshold",
        float,
        NO_SPEECH_THRESHOLD,
        "no-speech probability above which an improbable window is dropped as silence; none also decodes "
        "windows with no voice in them",
        0.0,
        1.0,
        can_be_none=True,
    ),
    Option(
        "best_of",
        int,
        BEST_OF,
        "candidates sampled per window above temperature 0; the likeliest is kept",
        1,
        MAX_BEST_OF,
    ),
)


def method_option(methods: tuple[str, ...]) -> Option:
    described = "; ".join(f"{name}: {METHODS[name].description}" for name in methods)
    return Option(
        "alignment_method",
        str,
        DEFAULT_ALIGNMENT_METHOD,
        f"how word times are read ({described})",
        choices=methods,
    )


LINE_OPTIONS = (
    Option("max_line_width", int, None, "srt/vtt: characters in a line", 1, MAX_LINE_CHARS),
    Option("max_line_count", int, None, "srt/vtt: lines in a cue (with max_line_width)", 1, MAX_LINES),
    Option("max_words_per_line", int, None, "srt/vtt: words in a line", 1, MAX_LINE_WORDS),
    Option("highlight_words", bool, False, "srt/vtt: a cue per word, the word underlined"),
)
TRANSCRIPTION_OPTIONS = (*FALLBACK_OPTIONS, *SAMPLING_OPTIONS, method_option(TRANSCRIPTION_METHODS))
ALIGNMENT_OPTIONS = (method_option(ALIGNMENT_METHODS),)


# ---------------------------------------------------------------------------- what a request runs with


@dataclass(frozen=True)
class TranscriptionOptions:
    """How a transcription decodes its windows and reads their word times (TRANSCRIPTION_OPTIONS)."""

    temperature: float = 0.0
    compression_ratio_threshold: float | None = COMPRESSION_RATIO_THRESHOLD
    logprob_threshold: float | None = LOGPROB_THRESHOLD
    no_speech_threshold: float | None = NO_SPEECH_THRESHOLD
    best_of: int = BEST_OF
    alignment_method: str = DEFAULT_ALIGNMENT_METHOD
    # SAMPLING_OPTIONS given (vLLM's SamplingParams names: max_completion_tokens becomes max_tokens).
    sampling: Mapping[str, Any] = field(default_factory=dict)
    # FallbackOptions.at_once: not a request's field; the server sets it for requests a client waits on.
    temperatures_at_once: bool = False

    @classmethod
    def of(cls, **values: Any) -> TranscriptionOptions:
        """From keyword arguments named as TRANSCRIPTION_OPTIONS (None: the default), each checked."""
        checked = check_values({k: v for k, v in values.items() if v is not None}, TRANSCRIPTION_OPTIONS)
        return cls.from_checked(checked)

    @classmethod
    def from_checked(cls, checked: Mapping[str, Any]) -> TranscriptionOptions:
        own = {f.name for f in fields(cls)} - {"sampling", "temperatures_at_once"}
        sampling = {
            ("max_tokens" if name == "max_completion_tokens" else name): value
            for name, value in checked.items()
            if name not in own and value is not None
        }
        return cls(**{k: v for k, v in checked.items() if k in own}, sampling=sampling)

    @property
    def method(self) -> AlignmentMethod:
        return method_named(self.alignment_method)

    @property
    def fallback(self) -> FallbackOptions:
        return FallbackOptions.starting_at(
            self.temperature,
            compression_ratio_threshold=self.compression_ratio_threshold,
            logprob_threshold=self.logprob_threshold,
            no_speech_threshold=self.no_speech_threshold,
            best_of=self.best_of,
            at_once=self.temperatures_at_once,
        )

    def with_method(self, name: str) -> TranscriptionOptions:
        return replace(self, alignment_method=name)

    def with_temperatures_at_once(self) -> TranscriptionOptions:
        return replace(self, temperatures_at_once=True)


@dataclass(frozen=True)
class AlignmentOptions:
    """How a forced alignment reads its word times (ALIGNMENT_OPTIONS)."""

    alignment_method: str = DEFAULT_ALIGNMENT_METHOD

    @classmethod
    def of(cls, **values: Any) -> AlignmentOptions:
        return cls(**check_values({k: v for k, v in values.items() if v is not None}, ALIGNMENT_OPTIONS))

    @property
    def method(self) -> AlignmentMethod:
        return method_named(self.alignment_method)


@dataclass(frozen=True)
class SubtitleOptions:
    """openai-whisper's subtitle line controls (LINE_OPTIONS, its CLI's ``--max_line_width`` and friends).

    ``max_line_width`` and ``max_line_count`` together re-flow words across segments into cues of at
    most that many lines of that many characters; alone, each only wraps lines within a segment.
    ``highlight_words`` adds a cue per word with that word in ``<u>…</u>`` (karaoke style).
    """

    max_line_width: int | None = None
    max_line_count: int | None = None
    max_words_per_line: int | None = None
    highlight_words: bool = False

    def __post_init__(self) -> None:
        check_values(
            {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None},
            LINE_OPTIONS,
        )

    @property
    def is_default(self) -> bool:
        return self == SubtitleOptions()
