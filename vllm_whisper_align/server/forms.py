"""Multipart forms read by hand, and their OpenAPI schema, from ``vllm_whisper_align.options``.

By hand rather than through a pydantic model, so that every mistake becomes a 400 whose message names
the field (FastAPI would answer 422), and so that the official ``openai`` client's repeated
``timestamp_granularities[]`` fields are understood. The option fields (sampling, fallback, alignment
method, line controls) are the options' own names, ranges and messages.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from starlette.datastructures import UploadFile

from vllm_whisper_align.errors import InputError
from vllm_whisper_align.formats.responses import ALIGNMENT_FORMATS, GRANULARITIES, RESPONSE_FORMATS
from vllm_whisper_align.options import (
    ALIGNMENT_OPTIONS,
    LINE_OPTIONS,
    TRANSCRIPTION_OPTIONS,
    AlignmentOptions,
    Option,
    SubtitleOptions,
    TranscriptionOptions,
    closest_name,
    echo,
)
from vllm_whisper_align.server.errors import RequestError


def text(form: Any, name: str) -> str | None:
    """A plain form field; a file part sent under a field's name is refused, not read as text."""
    value = form.get(name)
    if isinstance(value, UploadFile):
        raise RequestError(f"`{name}` must be a form field, not a file", name)
    return value


def choice(form: Any, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = text(form, name) or default
    if value not in allowed:
        raise RequestError(f"`{name}` must be one of {', '.join(allowed)}; got {echo(value)}", name)
    return value


TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes"), ("false", "0", "no")


def flag(form: Any, name: str) -> bool:
    value = (text(form, name) or "false").strip().lower()
    if value not in TRUE_WORDS + FALSE_WORDS:
        raise RequestError(f"`{name}` must be true or false; got {echo(value)}", name)
    return value in TRUE_WORDS


# Fields a form may repeat: the official client sends one `timestamp_granularities[]` per granularity.
REPEATABLE_FIELDS = frozenset({"timestamp_granularities[]", "timestamp_granularities"})


def check_fields(form: Any, allowed: Iterable[str]) -> None:
    """Every field of ``form`` is one the route reads, and a single-valued one comes once: an unknown
    field (a typo) or a second value would otherwise be dropped without a word."""
    allowed = set(allowed)
    counts = Counter(name for name, _ in form.multi_items())
    for name, count in counts.items():
        if name not in allowed:
            close = closest_name(name, allowed)
            hint = f"; did you mean `{close}`?" if close else f"; this route reads {_listed(allowed)}"
            raise RequestError(f"unknown field {echo(name)}{hint}", name)
        if count > 1 and name not in REPEATABLE_FIELDS:
            raise RequestError(f"`{name}` is given {count} times; give it once", name)


def _listed(names: Iterable[str]) -> str:
    return ", ".join(f"`{name}`" for name in sorted(names))


def granularities(form: Any) -> list[str]:
    values = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    for value in values:
        if value not in GRANULARITIES:
            raise RequestError(
                f"`timestamp_granularities[]` entries must be word or segment; got {echo(value)}",
                "timestamp_granularities[]",
            )
    return list(dict.fromkeys(values))


def option_values(form: Any, options: Iterable[Option]) -> dict[str, Any]:
    """The options the form gives (an empty field is not given), each parsed and checked."""
    values = {}
    for option in options:
        raw = text(form, option.name)
        if raw in (None, ""):
            continue
        try:
            values[option.name] = option.parse(raw)
        except InputError as error:
            raise RequestError(str(error), error.param) from None
    return values


def transcription_options(form: Any) -> TranscriptionOptions:
    return TranscriptionOptions.from_checked(option_values(form, TRANSCRIPTION_OPTIONS))


def alignment_options(form: Any) -> AlignmentOptions:
    return AlignmentOptions(**option_values(form, ALIGNMENT_OPTIONS))


def subtitle_options(form: Any) -> SubtitleOptions:
    """openai-whisper's line controls as form fields (srt and vtt only)."""
    return SubtitleOptions(**option_values(form, LINE_OPTIONS))


def _fields(schema: dict[str, Any]) -> frozenset[str]:
    """The form fields a route's OpenAPI schema declares: the one list of what it reads."""
    return frozenset(schema["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"])


def token_ids(raw: str | None) -> list[int] | None:
    if raw is None:
        return None
    try:
        ids = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: lists nested thousands deep
        raise RequestError("`tokens` must be a JSON list of integers", "tokens") from None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise RequestError("`tokens` must be a JSON list of integers", "tokens")
    return ids


# ---------------------------------------------------------------------------- OpenAPI


def option_schema(option: Option) -> dict[str, Any]:
    kinds = {float: "number", int: "integer", str: "string", bool: "boolean"}
    schema: dict[str, Any] = {"type": kinds[option.kind], "description": option.help}
    if option.choices:
        schema["enum"] = list(option.choices)
    if option.low is not None and not option.also:
        schema["exclusiveMinimum" if option.low_open else "minimum"] = option.low
    if option.high is not None:
        schema["maximum"] = option.high
    return schema


def multipart_schema(properties: dict[str, Any], options: Iterable[Option] = ()) -> dict[str, Any]:
    """OpenAPI request body for a multipart form with a required audio ``file``."""
    schema = {
        "type": "object",
        "required": ["file"],
        "properties": {
            "file": {"type": "string", "format": "binary"},
            **properties,
            **{option.name: option_schema(option) for option in options},
        },
    }
    return {"requestBody": {"content": {"multipart/form-data": {"schema": schema}}}}


TRANSCRIPTION_SCHEMA = multipart_schema(
    {
        "model": {"type": "string"},
        "language": {"type": "string"},
        "prompt": {"type": "string"},
        "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS)},
        "timestamp_granularities[]": {
            "type": "array",
            "items": {"type": "string", "enum": list(GRANULARITIES)},
        },
        "stream": {"type": "boolean"},
    },
    (*TRANSCRIPTION_OPTIONS, *LINE_OPTIONS),
)

ALIGNMENT_SCHEMA = multipart_schema(
    {
        "model": {"type": "string"},
        "text": {"type": "string", "description": "text spoken in the audio"},
        "tokens": {"type": "string", "description": "JSON list of token ids (instead of text)"},
        "subtitles": {
            "type": "string",
            "format": "binary",
            "description": "SRT or WebVTT file of the audio to re-time (instead of text): every cue keeps "
            "its number and text and gets new times; response_format defaults to the file's format",
        },
        "language": {"type": "string"},
        "response_format": {"type": "string", "enum": list(ALIGNMENT_FORMATS)},
        "stream": {"type": "boolean", "description": "verbose_json as server-sent events, window by window"},
    },
    (*ALIGNMENT_OPTIONS, *LINE_OPTIONS),
)

TRANSCRIPTION_FIELDS = _fields(TRANSCRIPTION_SCHEMA) | REPEATABLE_FIELDS
ALIGNMENT_FIELDS = _fields(ALIGNMENT_SCHEMA)
