"""HTTP routes: multipart forms in (``forms``), OpenAI-shaped JSON / text / SRT / VTT out, OpenAI error
bodies on 400 (``errors``). The requests themselves run on ``runners.service``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile
from vllm.entrypoints.serve.utils.api_utils import with_cancellation
from vllm.utils import random_uuid

from vllm_whisper_align.align.results import Transcript
from vllm_whisper_align.engine.vllm_internals import speech_to_text_handler
from vllm_whisper_align.errors import InputError
from vllm_whisper_align.formats import events, retiming
from vllm_whisper_align.formats.responses import ALIGNMENT_FORMATS, RESPONSE_FORMATS, write_result
from vllm_whisper_align.formats.subtitles import SUBTITLE_FORMATS, SubtitleFile, read_subtitles
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.options import SubtitleOptions
from vllm_whisper_align.runners import decoding, driver
from vllm_whisper_align.server import forms, streaming, uploads
from vllm_whisper_align.server.errors import RequestError, error_response, http_error
from vllm_whisper_align.server.plugin import ServerState

logger = get_logger(__name__)

router = APIRouter()

# Media types of the subtitle formats; other text formats are text/plain.
MEDIA_TYPES = {"srt": "application/x-subrip", "vtt": "text/vtt"}


def _state(request: Request) -> ServerState:
    state = getattr(request.app.state, "whisper_align", None)
    if state is None:
        raise RequestError("word timestamps need an engine; this server has none", status=503)
    return state


async def _audio(form: Any, state: ServerState):
    """The ``file`` part decoded (a long recording's samples go to a temporary file; its windows are read
    back as they run)."""
    data = await uploads.read_upload(form, state.limits)
    return await state.decoders.decode(data, state.limits.max_audio_s)


async def _rendered(
    transcript: Transcript,
    response_format: str,
    granularities: list[str],
    options: SubtitleOptions | None = None,
) -> Response:
    """The answer in its format, written in a thread: writing a long recording's hundred thousand words
    on the event loop held every other client back meanwhile."""
    return await asyncio.to_thread(_render, transcript, response_format, granularities, options)


def _render(
    transcript: Transcript,
    response_format: str,
    granularities: list[str],
    options: SubtitleOptions | None = None,
) -> Response:
    if response_format == "verbose_json":
        return JSONResponse(events.verbose_body(transcript, granularities))
    if response_format == "json":
        return JSONResponse({"text": transcript.text})
    granularity = "word" if "word" in granularities else "segment"
    text = write_result(transcript, response_format, granularity, options)
    return PlainTextResponse(text, media_type=MEDIA_TYPES.get(response_format, "text/plain"))


async def _answer(raw_request: Request, handler, **kwargs) -> Response:
    """Reads the form (within the limits: ``uploads``), then runs ``handler`` so that a client disconnect
    cancels it.

    vLLM's ``with_cancellation`` listens on the request's receive channel, so the body must be
    fully read before it starts.
    """
    try:
        state = _state(raw_request)
    except RequestError as error:
        return error_response(error.message, error.param, error.status)
    try:
        form = await uploads.read_form(raw_request, state.limits)
    except RequestError as error:
        return error_response(error.message, error.param, error.status)
    # In flight once its body is in: a client still sending (or stalled) holds no engine memory back.
    async with state.service.request_in_flight():
        return await _cancellable(raw_request=raw_request, handler=handler, state=state, form=form, **kwargs)


@with_cancellation
async def _cancellable(raw_request: Request, handler, **kwargs) -> Response:
    try:
        return await handler(raw_request=raw_request, **kwargs)
    except InputError as error:
        error = http_error(error)
        return error_response(error.message, error.param, error.status)
    except RequestError as error:
        return error_response(error.message, error.param, error.status)


async def _speech_to_text(raw_request: Request, state: ServerState, form: Any, task: str) -> Response:
    stream = forms.flag(form, "stream")
    # verbose_json streams here, with every field of ours; json and text stream as vLLM's own, which
    # reads its request's fields, and none of ours.
    vllm_stream = stream and forms.text(form, "response_format") != "verbose_json"
    vllm_fields = set(_vllm_request_class(task).model_fields) if vllm_stream else set()
    forms.check_fields(form, forms.TRANSCRIPTION_FIELDS | vllm_fields)
    if vllm_stream:
        for name in forms.TRANSCRIPTION_FIELDS - vllm_fields - forms.REPEATABLE_FIELDS:
            if name in form:
                raise RequestError(f"`{name}` does not apply to `stream=true`", name)
    state.check_model(forms.text(form, "model"))
    response_format = forms.choice(form, "response_format", RESPONSE_FORMATS, "json")
    granularities = forms.granularities(form)
    subtitle_options = forms.subtitle_options(form)
    if granularities and response_format != "verbose_json":
        raise RequestError(
            "`timestamp_granularities[]` requires `response_format=verbose_json`", "timestamp_granularities[]"
        )
    if stream:
        if response_format == "verbose_json":
            return await _streamed_transcription(state, form, task, granularities)
        if response_format not in ("json", "text"):
            raise RequestError(
                "`stream=true` streams json or text (vLLM's stream), or verbose_json with its timestamps; "
                f"not {response_format}",
                "stream",
            )
        forms.transcription_options(form)  # the sampling fields' ranges, as without `stream`
        return await _stream_with_vllm(raw_request, state, form, task)
    options = forms.transcription_options(form)
    samples = await _audio(form, state)
    transcript = await state.service.transcribe(
        samples,
        request_id=f"trsc-{random_uuid()}",
        language=forms.text(form, "language") or None,
        task=task,
        # Segments without timestamp tokens come from word times, so every timed format aligns.
        word_timestamps=response_format in ("verbose_json", "srt", "vtt"),
        prompt=forms.text(form, "prompt") or None,
        options=options,
    )
    return await _rendered(transcript, response_format, granularities, subtitle_options)


async def _streamed_transcription(
    state: ServerState, form: Any, task: str, granularities: list[str]
) -> Response:
    """verbose_json streamed window by window (``server.streaming``); the request is checked and its
    language detected before the stream starts."""
    options = forms.transcription_options(form)
    samples = await _audio(form, state)
    request_id = f"trsc-{random_uuid()}"
    plan = await state.service.transcription_plan(
        samples,
        request_id=request_id,
        language=forms.text(form, "language") or None,
        task=task,
        prompt=forms.text(form, "prompt") or None,
        options=options,
    )
    return streaming.windows_response(state.service, plan, request_id, granularities)


@router.post("/v1/audio/transcriptions", openapi_extra=forms.TRANSCRIPTION_SCHEMA)
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
    candidates and keeps the likeliest. These form fields are extensions named as openai-whisper's
    arguments; ``none`` turns a threshold off.
    """
    return await _answer(raw_request, _speech_to_text, task="transcribe")


@router.post("/v1/audio/translations", openapi_extra=forms.TRANSCRIPTION_SCHEMA)
async def create_translation(raw_request: Request):
    """OpenAI's translation API (to English), with the same timestamp options as transcriptions."""
    return await _answer(raw_request, _speech_to_text, task="translate")


@router.get("/v1/audio/alignments/stats")
async def alignment_stats(raw_request: Request):
    """What the workers hold for word timestamps: live requests, unfetched results, bytes; and the open
    realtime streams and the audio their buffers hold."""
    try:
        state = _state(raw_request)
        return JSONResponse({**await state.service.stats(), **state.live.stats()})
    except InputError as error:
        error = http_error(error)
        return error_response(error.message, error.param, error.status)
    except RequestError as error:
        return error_response(error.message, error.param, error.status)


@router.post("/v1/audio/alignments", openapi_extra=forms.ALIGNMENT_SCHEMA)
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


async def _alignment(raw_request: Request, state: ServerState, form: Any) -> Response:
    forms.check_fields(form, forms.ALIGNMENT_FIELDS)
    state.check_model(forms.text(form, "model"))
    if form.get("subtitles") is not None:
        if forms.flag(form, "stream"):
            raise RequestError("re-timing `subtitles` does not stream; send it without `stream`", "stream")
        return await _retiming(state, form)
    response_format = forms.choice(form, "response_format", ALIGNMENT_FORMATS, "json")
    subtitle_options = forms.subtitle_options(form)
    options = forms.alignment_options(form)
    text, token_ids = forms.text(form, "text"), forms.token_ids(forms.text(form, "tokens"))
    if (text is None) == (token_ids is None):
        raise RequestError("give exactly one of `text` or `tokens`", "text")
    if forms.flag(form, "stream"):
        return await _streamed_alignment(
            state, form, options, response_format, text=text, token_ids=token_ids
        )
    samples = await _audio(form, state)
    transcript = await _aligned(state, samples, form, options, text=text, token_ids=token_ids)
    if response_format == "json":
        return await asyncio.to_thread(_alignment_json, transcript)
    return await _rendered(transcript, response_format, ["word", "segment"], subtitle_options)


def _alignment_json(transcript: Transcript) -> Response:
    body = transcript.to_dict()
    return JSONResponse({k: body[k] for k in ("text", "words", "tokens")})


async def _streamed_alignment(
    state: ServerState, form: Any, options, response_format: str, **given
) -> Response:
    """A forced alignment streamed (verbose_json): audio up to 30 s as its one window; a long-form
    alignment's windows once the whole recording is read (``server.streaming.whole_response``)."""
    if response_format != "verbose_json":
        raise RequestError("`stream=true` streams `response_format=verbose_json` only", "stream")
    samples = await _audio(form, state)
    request_id = f"algn-{random_uuid()}"
    if not driver.needs_windows(samples):
        with _given_field(given):
            plan = state.service.alignment_plan(
                samples, language=forms.text(form, "language") or None, options=options, **given
            )
        return streaming.windows_response(state.service, plan, request_id, ["word", "segment"], forced=True)
    with _given_field(given):  # the text's mistakes are a 400 here, not an error event mid-stream
        state.service.tokens.check_language(forms.text(form, "language") or None)
        # In a thread, as the alignment itself tokenizes it: a long text takes a while.
        tokens = state.service.tokens
        await asyncio.to_thread(decoding.text_to_tokens, given["text"], given["token_ids"], tokens)
    return streaming.whole_response(
        state.service,
        lambda: _aligned(state, samples, form, options, **given),
        samples,
        request_id,
        ["word", "segment"],
    )


@contextlib.contextmanager
def _given_field(given: dict):
    """A mistake in the given text named as the field it came in (``text`` or ``tokens``)."""
    field = "tokens" if given.get("token_ids") is not None else "text"
    try:
        yield
    except InputError as error:
        if error.param in (None, "text", "tokens"):
            error.param = field
        raise


async def _aligned(state: ServerState, samples, form: Any, options, **given) -> Transcript:
    """The service's alignment, a mistake in the text named as the field it came in."""
    with _given_field(given):
        return await state.service.align(
            samples,
            request_id=f"algn-{random_uuid()}",
            language=forms.text(form, "language") or None,
            options=options,
            **given,
        )


async def _retiming(state: ServerState, form: Any) -> Response:
    """The ``subtitles`` part's cues with new times (``formats.retiming``)."""
    if forms.text(form, "text") is not None or forms.text(form, "tokens") is not None:
        raise RequestError("give one of `text`, `tokens` or `subtitles`", "subtitles")
    if not forms.subtitle_options(form).is_default:
        raise RequestError("line controls do not apply to `subtitles`: cues keep their lines", "subtitles")
    subtitles = await _subtitles(form, state)
    response_format = forms.choice(form, "response_format", ALIGNMENT_FORMATS, subtitles.format)
    options = forms.alignment_options(form)
    try:
        text = retiming.alignment_text(subtitles.cues)
    except ValueError as error:
        raise RequestError(str(error), "subtitles") from None
    samples = await _audio(form, state)
    try:
        transcript = await _aligned(state, samples, form, options, text=text)
    except InputError as error:
        if error.param == "text":  # the text came from the subtitles
            error.param = "subtitles"
        raise
    # Long files take a while: retimed and written in a thread.
    retimed = await asyncio.to_thread(retiming.retime, subtitles, transcript)
    return await asyncio.to_thread(_render_retimed, retimed, transcript, response_format)


def _render_retimed(retimed: retiming.Retimed, transcript: Transcript, response_format: str) -> Response:
    if response_format in SUBTITLE_FORMATS:
        written = retiming.render(retimed, transcript, response_format)
        return PlainTextResponse(written, media_type=MEDIA_TYPES[response_format])
    return JSONResponse(retiming.retimed_body(retimed, transcript, verbose=response_format == "verbose_json"))


async def _subtitles(form: Any, state: ServerState) -> SubtitleFile:
    """The ``subtitles`` part, a file or a plain field, read into cues."""
    part = form.get("subtitles")
    too_large = isinstance(part, UploadFile) and (part.size or 0) > state.limits.max_file_bytes
    data = b"" if too_large else await part.read() if isinstance(part, UploadFile) else part
    if too_large or len(data) > state.limits.max_file_bytes:
        raise RequestError(f"`subtitles` is over {state.limits.max_file_mb:g} MB", "subtitles")
    try:
        return await asyncio.to_thread(read_subtitles, data)
    except ValueError as error:
        raise RequestError(f"`subtitles`: {error}", "subtitles") from None


async def _stream_with_vllm(raw_request: Request, state: ServerState, form: Any, task: str) -> Response:
    """Streaming without timestamps is vLLM's own handler, as without this plugin, except that
    languages this model cannot transcribe are refused first, and an English-only model is told its
    language (vLLM would try to detect one, and fail)."""
    from pydantic import ValidationError
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    handler = speech_to_text_handler(raw_request.app.state, task)
    request_class = _vllm_request_class(task)
    upload = form.get("file")
    if handler is None or not isinstance(upload, UploadFile):
        raise RequestError("`file` is required: the audio file to process, as a multipart upload", "file")
    fields = {name: value for name, value in form.multi_items() if name != "file"}
    if any(isinstance(value, UploadFile) for value in fields.values()):
        raise RequestError(
            "only `file` may be a file part", next(n for n, v in fields.items() if isinstance(v, UploadFile))
        )
    language = fields.get("language") or None
    state.service.tokens.check_language(language, task)
    if language is None and state.service.tokens.is_english_only:
        fields["language"] = "en"
    try:
        request = request_class(file=upload, **fields)
    except ValidationError as error:
        raise RequestError(f"invalid streaming request: {error.errors()[0].get('msg')}") from None
    create = handler.create_transcription if task == "transcribe" else handler.create_translation
    answer = await create(await uploads.read_upload(form, state.limits), request, raw_request)
    if isinstance(answer, ErrorResponse):
        return JSONResponse(answer.model_dump(), status_code=answer.error.code)
    if hasattr(answer, "model_dump"):
        return JSONResponse(answer.model_dump())
    return StreamingResponse(answer, media_type="text/event-stream")


def _vllm_request_class(task: str):
    """vLLM's request model of ``task``'s streaming handler."""
    from vllm.entrypoints.speech_to_text.transcription.protocol import TranscriptionRequest
    from vllm.entrypoints.speech_to_text.translation.protocol import TranslationRequest

    return TranscriptionRequest if task == "transcribe" else TranslationRequest
