"""HTTP: multipart forms in, OpenAI-shaped JSON / text / SRT / VTT out, OpenAI error bodies on 400.

The form is read by hand rather than through a pydantic model so that every mistake becomes a
400 with a message naming the field (FastAPI would answer 422), and so that the official
``openai`` client's ``timestamp_granularities[]`` repeated fields are understood.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile
from vllm import SamplingParams
from vllm.entrypoints.serve.utils.api_utils import with_cancellation
from vllm.exceptions import VLLMValidationError
from vllm.utils import random_uuid

from vllm_whisper_align.audio.decode import AudioError, AudioTooLongError, decode_audio
from vllm_whisper_align.engine.vllm_internals import speech_to_text_handler
from vllm_whisper_align.formats import retiming
from vllm_whisper_align.formats.responses import (
    ALIGNMENT_FORMATS,
    GRANULARITIES,
    RESPONSE_FORMATS,
    SubtitleOptions,
    write_result,
)
from vllm_whisper_align.formats.subtitles import SUBTITLE_FORMATS, SubtitleFile, read_subtitles
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.protocol import ALIGNMENT_METHODS, DEFAULT_ALIGNMENT_METHOD, TRANSCRIPTION_METHODS
from vllm_whisper_align.runners import decoding
from vllm_whisper_align.runners.service import AlignmentService, RequestError, echo

logger = get_logger(__name__)

router = APIRouter()

# Subtitle line controls a form may set (openai-whisper's names), besides the flag highlight_words.
SUBTITLE_FIELDS = ("max_line_width", "max_line_count", "max_words_per_line")
# Media types of the subtitle formats; other text formats are text/plain.
MEDIA_TYPES = {"srt": "application/x-subrip", "vtt": "text/vtt"}
# Seeds vLLM's own OpenAI protocol accepts (torch's int64).
SEED_RANGE = (-(2**63), 2**63 - 1)

# SamplingParams fields a transcription form may set, with their types.
SAMPLING_FIELDS = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "seed": int,
    "frequency_penalty": float,
    "presence_penalty": float,
    "repetition_penalty": float,
    "max_completion_tokens": int,
}

# openai-whisper's transcribe arguments for the temperature fallback and the silence rule (OpenAI's
# API has none); "none" turns one off, as None does there.
FALLBACK_FIELDS = ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold")


def _method_schema(methods: tuple[str, ...]) -> dict[str, Any]:
    description = (
        "how word times are read: auto (per-request heads, onset-refined starts; default), "
        "fixed (the model's tuned alignment heads, as openai-whisper)"
    )
    if "characters" in methods:
        description += ", characters (the text forced one character per token; audio up to 30 s)"
    return {"alignment_method": {"type": "string", "enum": list(methods), "description": description}}


def _multipart_schema(properties: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI request body for a multipart form with a required audio ``file``."""
    schema = {
        "type": "object",
        "required": ["file"],
        "properties": {"file": {"type": "string", "format": "binary"}, **properties},
    }
    return {"requestBody": {"content": {"multipart/form-data": {"schema": schema}}}}


SUBTITLE_SCHEMA = {
    **{
        name: {"type": "integer", "minimum": 1, "description": "srt/vtt line control (openai-whisper's)"}
        for name in SUBTITLE_FIELDS
    },
    "highlight_words": {"type": "boolean", "description": "srt/vtt: a cue per word, underlined"},
}

FORM_SCHEMA = _multipart_schema(
    {
        "model": {"type": "string"},
        "language": {"type": "string"},
        "prompt": {"type": "string"},
        "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS)},
        "timestamp_granularities[]": {
            "type": "array",
            "items": {"type": "string", "enum": list(GRANULARITIES)},
        },
        "temperature": {"type": "number"},
        **{name: {"type": "number"} for name in FALLBACK_FIELDS},
        "best_of": {
            "type": "integer",
            "minimum": 1,
            "maximum": decoding.MAX_BEST_OF,
            "description": "candidates sampled per window above temperature 0, the likeliest kept "
            f"(default {decoding.BEST_OF})",
        },
        "stream": {"type": "boolean"},
        **_method_schema(TRANSCRIPTION_METHODS),
        **SUBTITLE_SCHEMA,
    }
)

ALIGNMENT_SCHEMA = _multipart_schema(
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
        **_method_schema(ALIGNMENT_METHODS),
        **SUBTITLE_SCHEMA,
    }
)


def error_response(message: str, param: str | None = None, status: int = 400) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _service(request: Request) -> AlignmentService:
    service = getattr(request.app.state, "whisper_align", None)
    if service is None:
        raise RequestError("word timestamps need an engine; this server has none", status=503)
    return service


async def _form(request: Request) -> Any:
    try:
        return await request.form()
    except Exception as error:  # malformed multipart bodies raise assorted parser errors
        raise RequestError(f"could not read the multipart form: {error}") from None


async def _audio(form: Any, service: AlignmentService):
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise RequestError("`file` is required: the audio file to process, as a multipart upload", "file")
    data = await upload.read()
    limits = service.limits
    if len(data) > limits.max_file_bytes:
        raise RequestError(
            f"file is {len(data)} bytes; at most {limits.max_file_bytes} bytes ({limits.max_file_mb:g} MB) "
            "are accepted",
            "file",
        )
    if not data:
        raise RequestError("`file` is empty", "file")
    try:
        # Decoding takes seconds for long files: in a thread, so the event loop keeps serving. A long
        # recording's samples go to a temporary file; its windows are read back as they run.
        return await asyncio.to_thread(decode_audio, data, max_seconds=limits.max_audio_s, spill=True)
    except AudioTooLongError as error:
        raise service.too_long_error(error.seconds) from None
    except AudioError as error:
        raise RequestError(str(error), "file") from None


def _text(form: Any, name: str) -> str | None:
    """A plain form field; a file part sent under a field's name is refused, not read as text."""
    value = form.get(name)
    if isinstance(value, UploadFile):
        raise RequestError(f"`{name}` must be a form field, not a file", name)
    return value


def _choice(form: Any, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = _text(form, name) or default
    if value not in allowed:
        raise RequestError(f"`{name}` must be one of {', '.join(allowed)}; got {echo(value)}", name)
    return value


def _granularities(form: Any) -> list[str]:
    values = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    for value in values:
        if value not in GRANULARITIES:
            raise RequestError(
                f"`timestamp_granularities[]` entries must be word or segment; got {echo(value)}",
                "timestamp_granularities[]",
            )
    return list(dict.fromkeys(values))


def _sampling(form: Any) -> dict[str, Any]:
    """The sampling fields given, checked as vLLM's SamplingParams checks them."""
    sampling = {}
    for name, kind in SAMPLING_FIELDS.items():
        raw = _text(form, name)
        if raw in (None, ""):
            continue
        try:
            sampling[name] = kind(raw)
        except ValueError:
            raise RequestError(f"`{name}` must be a number; got {echo(raw)}", name) from None
    seed = sampling.get("seed")
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise RequestError(f"`seed` must be a 64-bit integer in {SEED_RANGE[0]}..{SEED_RANGE[1]}", "seed")
    if "max_completion_tokens" in sampling:
        sampling["max_tokens"] = sampling.pop("max_completion_tokens")
    try:
        SamplingParams(**sampling)
    except (ValueError, VLLMValidationError) as error:  # vLLM's is not a ValueError
        name = getattr(error, "parameter", None)
        raise RequestError(str(error), "max_completion_tokens" if name == "max_tokens" else name) from None
    return sampling


def _fallback(form: Any, temperature: float) -> decoding.FallbackOptions:
    """The fallback schedule from ``temperature`` and the thresholds given (the reference's defaults)."""
    thresholds: dict[str, float | None] = {}
    for name in FALLBACK_FIELDS:
        raw = _text(form, name)
        if raw in (None, ""):
            continue
        if raw.strip().lower() == "none":
            thresholds[name] = None
            continue
        try:
            thresholds[name] = float(raw)
        except ValueError:
            raise RequestError(f"`{name}` must be a number (or none); got {echo(raw)}", name) from None
    raw_best_of = _text(form, "best_of")
    if raw_best_of not in (None, ""):
        try:
            thresholds["best_of"] = int(raw_best_of)
        except ValueError:
            raise RequestError(f"`best_of` must be an integer; got {echo(raw_best_of)}", "best_of") from None
    options = decoding.FallbackOptions.starting_at(temperature, **thresholds)
    try:
        options.validate()
    except ValueError as error:
        param = next(
            (name for name in (*FALLBACK_FIELDS, "best_of") if str(error).startswith(name)), "temperature"
        )
        raise RequestError(str(error), param) from None
    return options


def _flag(form: Any, name: str) -> bool:
    return str(_text(form, name) or "false").lower() in ("1", "true", "yes")


def _subtitle_options(form: Any) -> SubtitleOptions:
    """openai-whisper's line controls as form fields (srt and vtt only)."""
    values: dict[str, Any] = {}
    for name in SUBTITLE_FIELDS:
        raw = _text(form, name)
        if raw not in (None, ""):
            try:
                values[name] = int(raw)
            except ValueError:
                raise RequestError(
                    f"`{name}` must be a positive whole number; got {echo(raw)}", name
                ) from None
    values["highlight_words"] = _flag(form, "highlight_words")
    try:
        return SubtitleOptions(**values)
    except ValueError as error:
        raise RequestError(str(error), str(error).split()[0]) from None


def _render(
    result: dict[str, Any],
    response_format: str,
    granularities: list[str],
    options: SubtitleOptions | None = None,
) -> Response:
    if response_format == "verbose_json":
        body = dict(result)
        if "word" not in granularities:
            body.pop("words", None)
            body.pop("tokens", None)
        if granularities and "segment" not in granularities:
            body["segments"] = None
        return JSONResponse(body)
    if response_format == "json":
        return JSONResponse({"text": result["text"]})
    granularity = "word" if "word" in granularities else "segment"
    text = write_result(result, response_format, granularity, options)
    return PlainTextResponse(text, media_type=MEDIA_TYPES.get(response_format, "text/plain"))


async def _answer(raw_request: Request, handler, **kwargs) -> Response:
    """Reads the form, then runs ``handler`` so that a client disconnect cancels it.

    vLLM's ``with_cancellation`` listens on the request's receive channel, so the body must be
    fully read before it starts.
    """
    try:
        service = _service(raw_request)
    except RequestError as error:
        return error_response(error.message, error.param, error.status)
    async with service.request_in_flight():
        try:
            form = await _form(raw_request)
        except RequestError as error:
            return error_response(error.message, error.param, error.status)
        return await _cancellable(
            raw_request=raw_request, handler=handler, service=service, form=form, **kwargs
        )


@with_cancellation
async def _cancellable(raw_request: Request, handler, **kwargs) -> Response:
    try:
        return await handler(raw_request=raw_request, **kwargs)
    except RequestError as error:
        return error_response(error.message, error.param, error.status)


async def _speech_to_text(raw_request: Request, service: AlignmentService, form: Any, task: str) -> Response:
    service.check_model(_text(form, "model"))
    response_format = _choice(form, "response_format", RESPONSE_FORMATS, "json")
    granularities = _granularities(form)
    subtitle_options = _subtitle_options(form)
    if granularities and response_format != "verbose_json":
        raise RequestError(
            "`timestamp_granularities[]` requires `response_format=verbose_json`", "timestamp_granularities[]"
        )
    if _flag(form, "stream"):
        if granularities or response_format not in ("json", "text"):
            raise RequestError(
                "`stream=true` cannot carry word or segment timestamps; send the request without "
                "`stream`, or stream without `timestamp_granularities[]`",
                "stream",
            )
        return await _stream_with_vllm(raw_request, service, form, task)
    sampling = _sampling(form)
    fallback = _fallback(form, sampling.pop("temperature", 0.0))
    alignment_method = _choice(form, "alignment_method", TRANSCRIPTION_METHODS, DEFAULT_ALIGNMENT_METHOD)
    samples = await _audio(form, service)
    result = await service.transcribe(
        samples,
        request_id=f"trsc-{random_uuid()}",
        language=_text(form, "language") or None,
        task=task,
        # Segments without timestamp tokens come from word times, so every timed format aligns.
        word_timestamps=response_format in ("verbose_json", "srt", "vtt"),
        prompt=_text(form, "prompt") or None,
        sampling=sampling,
        fallback=fallback,
        alignment_method=alignment_method,
    )
    return _render(result, response_format, granularities, subtitle_options)


@router.post("/v1/audio/transcriptions", openapi_extra=FORM_SCHEMA)
async def create_transcription(raw_request: Request):
    """OpenAI's transcription API; ``verbose_json`` + ``timestamp_granularities[]=word`` fills ``words``.

    Extension: ``verbose_json`` with word granularity also returns ``tokens`` (each token's id,
    text, start, end and probability).

    Windows are decoded as openai-whisper's ``transcribe`` decodes them: ``temperature`` (default
    0) starts the fallback schedule (then +0.2 up to 1.0), a window is decoded again at the next
    temperature when its ``compression_ratio`` is over ``compression_ratio_threshold`` (2.4) or its
    ``avg_logprob`` under ``logprob_threshold`` (-1.0), and dropped as silence when its
    ``no_speech_prob`` is over ``no_speech_threshold`` (0.6) and its ``avg_logprob`` under
    ``logprob_threshold``. Above temperature 0 each window samples ``best_of`` (default 1)
    candidates and keeps the likeliest. These form fields are extensions named as openai-whisper's arguments;
    ``none`` turns a threshold off.
    """
    return await _answer(raw_request, _speech_to_text, task="transcribe")


@router.post("/v1/audio/translations", openapi_extra=FORM_SCHEMA)
async def create_translation(raw_request: Request):
    """OpenAI's translation API (to English), with the same timestamp options as transcriptions."""
    return await _answer(raw_request, _speech_to_text, task="translate")


@router.get("/v1/audio/alignments/stats")
async def alignment_stats(raw_request: Request):
    """What the workers hold for word timestamps: live requests, unfetched results, bytes."""
    try:
        return JSONResponse(await _service(raw_request).stats())
    except RequestError as error:
        return error_response(error.message, error.param, error.status)


@router.post("/v1/audio/alignments", openapi_extra=ALIGNMENT_SCHEMA)
async def create_alignment(raw_request: Request):
    """Forced alignment: when each word and token of the given ``text`` (or ``tokens``) is spoken.

    Multipart fields: ``file``, ``model``, ``text`` or ``tokens`` (a JSON list of token ids),
    optional ``language`` and ``response_format`` (json | verbose_json | srt | vtt; json gives
    ``text``, ``words`` and ``tokens``).

    Re-timing: a ``subtitles`` part (an SRT or WebVTT file) instead of ``text`` gives every cue new
    times and keeps its number and text; the answer is the file in its own format unless
    ``response_format`` says otherwise (json: ``text`` and ``cues``, each with ``aligned``: false
    for a cue placed between its neighbours; verbose_json: the alignment's body and ``cues``).
    """
    return await _answer(raw_request, _alignment)


async def _alignment(raw_request: Request, service: AlignmentService, form: Any) -> Response:
    service.check_model(_text(form, "model"))
    if form.get("subtitles") is not None:
        return await _retiming(service, form)
    response_format = _choice(form, "response_format", ALIGNMENT_FORMATS, "json")
    subtitle_options = _subtitle_options(form)
    alignment_method = _choice(form, "alignment_method", ALIGNMENT_METHODS, DEFAULT_ALIGNMENT_METHOD)
    text, token_ids = _text(form, "text"), _token_ids(_text(form, "tokens"))
    if (text is None) == (token_ids is None):
        raise RequestError("give exactly one of `text` or `tokens`", "text")
    samples = await _audio(form, service)
    result = await service.align(
        samples,
        request_id=f"algn-{random_uuid()}",
        text=text,
        token_ids=token_ids,
        language=_text(form, "language") or None,
        alignment_method=alignment_method,
    )
    if response_format == "json":
        return JSONResponse({k: result[k] for k in ("text", "words", "tokens")})
    return _render(result, response_format, ["word", "segment"], subtitle_options)


async def _retiming(service: AlignmentService, form: Any) -> Response:
    """The ``subtitles`` part's cues with new times (``retiming``)."""
    if _text(form, "text") is not None or _text(form, "tokens") is not None:
        raise RequestError("give one of `text`, `tokens` or `subtitles`", "subtitles")
    if not _subtitle_options(form).is_default:
        raise RequestError("line controls do not apply to `subtitles`: cues keep their lines", "subtitles")
    subtitles = await _subtitles(form, service)
    response_format = _choice(form, "response_format", ALIGNMENT_FORMATS, subtitles.format)
    alignment_method = _choice(form, "alignment_method", ALIGNMENT_METHODS, DEFAULT_ALIGNMENT_METHOD)
    try:
        text = retiming.alignment_text(subtitles.cues)
    except ValueError as error:
        raise RequestError(str(error), "subtitles") from None
    samples = await _audio(form, service)
    try:
        result = await service.align(
            samples,
            request_id=f"algn-{random_uuid()}",
            text=text,
            token_ids=None,
            language=_text(form, "language") or None,
            alignment_method=alignment_method,
        )
    except RequestError as error:
        if error.param == "text":  # the text came from the subtitles
            error.param = "subtitles"
        raise
    retimed = await asyncio.to_thread(retiming.retime, subtitles, result)  # long files take a while
    if response_format in SUBTITLE_FORMATS:
        written = retiming.render(retimed, result, response_format)
        return PlainTextResponse(written, media_type=MEDIA_TYPES[response_format])
    return JSONResponse(retiming.retimed_body(retimed, result, verbose=response_format == "verbose_json"))


async def _subtitles(form: Any, service: AlignmentService) -> SubtitleFile:
    """The ``subtitles`` part, a file or a plain field, read into cues."""
    part = form.get("subtitles")
    data = await part.read() if isinstance(part, UploadFile) else part
    if len(data) > service.limits.max_file_bytes:
        raise RequestError(f"`subtitles` is over {service.limits.max_file_mb:g} MB", "subtitles")
    try:
        return await asyncio.to_thread(read_subtitles, data)
    except ValueError as error:
        raise RequestError(f"`subtitles`: {error}", "subtitles") from None


def _token_ids(raw: str | None) -> list[int] | None:
    if raw is None:
        return None
    try:
        ids = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: lists nested thousands deep
        raise RequestError("`tokens` must be a JSON list of integers", "tokens") from None
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise RequestError("`tokens` must be a JSON list of integers", "tokens")
    return ids


async def _stream_with_vllm(
    raw_request: Request, service: AlignmentService, form: Any, task: str
) -> Response:
    """Streaming without timestamps is vLLM's own handler, as without this plugin, except that
    languages this model cannot transcribe are refused first, and an English-only model is told its
    language (vLLM would try to detect one, and fail)."""
    from pydantic import ValidationError
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.entrypoints.speech_to_text.transcription.protocol import TranscriptionRequest
    from vllm.entrypoints.speech_to_text.translation.protocol import TranslationRequest

    handler = speech_to_text_handler(raw_request.app.state, task)
    request_class = TranscriptionRequest if task == "transcribe" else TranslationRequest
    upload = form.get("file")
    if handler is None or not isinstance(upload, UploadFile):
        raise RequestError("`file` is required: the audio file to process, as a multipart upload", "file")
    fields = {name: value for name, value in form.multi_items() if name != "file"}
    if any(isinstance(value, UploadFile) for value in fields.values()):
        raise RequestError(
            "only `file` may be a file part", next(n for n, v in fields.items() if isinstance(v, UploadFile))
        )
    language = service.checked_language(fields.get("language") or None, task)
    if language is None and service.tokens.is_english_only:
        fields["language"] = "en"
    try:
        request = request_class(file=upload, **fields)
    except ValidationError as error:
        raise RequestError(f"invalid streaming request: {error.errors()[0].get('msg')}") from None
    create = handler.create_transcription if task == "transcribe" else handler.create_translation
    answer = await create(await upload.read(), request, raw_request)
    if isinstance(answer, ErrorResponse):
        return JSONResponse(answer.model_dump(), status_code=answer.error.code)
    if hasattr(answer, "model_dump"):
        return JSONResponse(answer.model_dump())
    return StreamingResponse(answer, media_type="text/event-stream")
