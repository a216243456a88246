"""Python API over ``vllm.LLM``: transcribe or align many files with one engine.

:class:`WhisperAligner` carries out what ``runners.driver`` asks, for every input of a call at once
(one ``generate`` call per round). Plain ``LLM.generate`` works too: put ``AlignmentParams`` in
``SamplingParams.extra_args`` (see :func:`vllm_whisper_align.runners.decoding.plan_transcription`) and
fetch the matrices afterwards with ``llm.collective_rpc("whisper_align_fetch", args=([{"key": ...,
"num_text_tokens": ...}],))``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import numba
import numpy as np

from vllm_whisper_align.align.results import Transcript
from vllm_whisper_align.audio.decode import AudioSource, SpilledSamples, decode_audio
from vllm_whisper_align.checkpoints.bundled import resolve_model
from vllm_whisper_align.engine import vllm_internals, window_features
from vllm_whisper_align.engine.settings import engine_environment, engine_settings, user_choices
from vllm_whisper_align.errors import NoCaptureError, OptionError
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.options import AlignmentOptions, TranscriptionOptions
from vllm_whisper_align.protocol import (
    RPC_CLEAR_ENCODER_CACHE,
    RPC_DISCARD,
    RPC_FETCH,
    RPC_NO_SPEECH,
    RPC_STATS,
    WhisperAlignConfig,
)
from vllm_whisper_align.runners import decoding, driver
from vllm_whisper_align.runners.packing import alignments, transcriptions

logger = get_logger(__name__)


def default_engine_args(model: str, **overrides: Any) -> dict[str, Any]:
    """Engine settings sized to the model and the machine (see engine.settings); anything given wins.

    Returns arguments only: the environment the engine also needs is :func:`engine_environment`'s.
    """
    given = user_choices(overrides)
    args = {"model": model, **engine_settings(model, given), **given}
    # Checked here so that a typo is one clear error, not an engine that fails to start.
    WhisperAlignConfig.from_additional_config(args.get("additional_config"))
    return args


def prepare_engine(model: str | None, **engine_args: Any) -> dict[str, Any]:
    """The engine arguments for ``model`` (resolved: a bundled name, a CT2 dir...), with this process's
    environment set for the engine's processes, which inherit it: what ``WhisperAligner`` and the corpus
    job's replicas do before they build an engine. The one place they change ``os.environ``."""
    args = default_engine_args(resolve_model(model), **engine_args)
    os.environ.update(engine_environment(args))
    return args


# How long close() lets the engine's processes exit before they are killed. vLLM's own default (5 s)
# is too short for a loaded 2-core machine, and a killed engine core leaks its shared memory.
ENGINE_SHUTDOWN_TIMEOUT_S = 60.0


class WhisperAligner:
    """One vLLM engine serving transcription and forced alignment with word timestamps.

    ``close()`` it (or use it as a context manager) when done: left to interpreter exit, vLLM's
    shutdown races it, and warns of an engine core that "exited unexpectedly" or was killed.
    """

    def __init__(self, model: str | None = None, **engine_args: Any):
        from vllm import LLM

        args = prepare_engine(model, **engine_args)
        self.model = args["model"]
        self.llm = LLM(**args)
        model_config = self.llm.llm_engine.model_config
        tokenizer = self.llm.get_tokenizer()
        self.facts = driver.EngineFacts.of_engine(model_config, tokenizer)
        self.tokens = self.facts.tokens
        self.suppress_tokens = list(self.facts.suppress_tokens)
        config = driver.plugin_options(args.get("additional_config"))
        self.packing, self.pack_alignments = config.packing, config.pack_alignments

    def close(self) -> None:
        """Stop the engine's processes and wait for them; a second call does nothing."""
        vllm_internals.shutdown_llm(self.llm, ENGINE_SHUTDOWN_TIMEOUT_S)

    def __enter__(self) -> WhisperAligner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- public API --------------------------------------------------------------------------

    def transcribe(
        self,
        audios: Sequence[AudioSource | np.ndarray],
        *,
        language: str | None = None,
        task: str = "transcribe",
        word_timestamps: bool = True,
        prompt: str | None = None,
        options: TranscriptionOptions | None = None,
        packing: bool | None = None,
        use_tqdm: bool = False,
        **option_values: Any,
    ) -> list[Transcript]:
        """One transcript per input (``words`` and ``tokens`` when ``word_timestamps``);
        ``Transcript.to_dict()`` is OpenAI's verbose_json body.

        Short inputs share 30 s windows (docs/packing.md) unless ``packing`` is False (None: the
        engine's ``whisper_align.packing``, on by default): each input then runs alone, its decoder
        seeing no other input's text.

        The decoding options are ``options``, or keyword arguments named as
        ``options.TRANSCRIPTION_OPTIONS`` (each checked): ``temperature`` starts openai-whisper's
        fallback schedule (then +0.2 up to 1.0); ``compression_ratio_threshold``,
        ``logprob_threshold`` and ``no_speech_threshold`` are its ``transcribe`` arguments, with its
        defaults (None turns one off); above temperature 0 each window samples ``best_of`` candidates
        and keeps the likeliest; ``alignment_method`` is "auto" (per-window heads, boundary rules,
        then English words placed by an acoustic model of phones), "heads" (auto without the model)
        or "fixed" (the tuned alignment heads, openai-whisper's way); ``top_p``, ``seed`` and the
        other sampling options are vLLM's.
        """
        options = _options(TranscriptionOptions, options, option_values)
        samples = [_samples(audio) for audio in audios]
        work = transcriptions(
            samples,
            self.facts,
            language=language,
            task=task,
            word_timestamps=word_timestamps,
            prompt=prompt,
            options=options,
            pack=self.packing if packing is None else packing,
        )
        return self.run(work, use_tqdm)

    def align(
        self,
        audios: Sequence[AudioSource | np.ndarray],
        texts: Sequence[str] | None = None,
        *,
        token_ids: Sequence[Sequence[int]] | None = None,
        language: str | None = None,
        options: AlignmentOptions | None = None,
        packing: bool | None = None,
        use_tqdm: bool = False,
        **option_values: Any,
    ) -> list[Transcript]:
        """Word and token times of text the model did not produce; audio of any length (over one
        window: ``longform``), every word with ``aligned``. ``alignment_method`` (or ``options``) as in
        :meth:`transcribe`, and "characters" for audio of one window. With ``packing`` (None: the
        engine's ``whisper_align.pack_alignments``, off by default) short inputs share windows, their
        texts forced in order: faster, their starts read a little less well (docs/packing.md)."""
        options = _options(AlignmentOptions, options, option_values)
        if (texts is None) == (token_ids is None):
            raise OptionError("give either texts or token_ids", "text")
        items = texts if texts is not None else token_ids
        if len(items) != len(audios):
            raise OptionError(f"{len(audios)} audios but {len(items)} texts", "text")
        nothing = [None] * len(items)
        work = alignments(
            [_samples(audio) for audio in audios],
            texts or nothing,
            token_ids or nothing,
            self.facts,
            language=language,
            options=options,
            pack=self.pack_alignments if packing is None else packing,
        )
        return self.run(work, use_tqdm)

    def detect_languages(self, samples: Sequence[np.ndarray]) -> list[str]:
        if self.facts.language_detection is None:
            return ["en"] * len(samples)
        return self.run(driver.together([driver.detect_language(s, self.facts) for s in samples]))

    def run_plans(self, plans: Sequence[decoding.Plan], use_tqdm: bool = False) -> list[Transcript]:
        """Plans made with ``runners.decoding`` run as the drivers run theirs (for tests and tools)."""
        return self.run(driver.together([driver.run_plan(plan, self.tokens) for plan in plans]), use_tqdm)

    def run(self, work: driver.Driver, use_tqdm: bool = False) -> Any:
        """A driver's commands carried out on this engine until it returns. The engine's encoder cache,
        and this process's cache of window features, serve the call's own repeats (a fallback retry,
        the second pass of a long alignment) and are emptied when the call ends, as the server empties
        them when idle: nothing is held, or reused, between calls."""
        try:
            return driver.carry_out(work, lambda command: self._answer(command, use_tqdm))
        finally:
            window_features.FEATURES.clear()
            self.llm.collective_rpc(RPC_CLEAR_ENCODER_CACHE)

    def discard(self, keys: Sequence[str]) -> int:
        return self._rpc(RPC_DISCARD, list(keys)) if keys else 0

    def no_speech_probs(self, windows: Sequence[decoding.WindowRequest]) -> list[float]:
        keys = decoding.no_speech_keys(windows)
        try:
            answers = self._rpc(RPC_NO_SPEECH, keys) if keys else []
        except NoCaptureError:
            answers = []
        return decoding.no_speech_probs(windows, answers)

    def capture_stats(self) -> dict[str, int]:
        return self._rpc(RPC_STATS)

    # ---- internals ---------------------------------------------------------------------------

    def _answer(self, command: driver.Command, use_tqdm: bool) -> Any:
        if isinstance(command, driver.Generate):
            requests = command.requests
            return self.llm.generate(
                [r.prompt for r in requests], [r.sampling_params for r in requests], use_tqdm=use_tqdm
            )
        if isinstance(command, driver.NoSpeech):
            return self._rpc(RPC_NO_SPEECH, command.keys)
        if isinstance(command, driver.Fetch):
            return self._rpc(RPC_FETCH, [asdict(r) for r in command.requests])
        if isinstance(command, driver.Discard):
            self._rpc(RPC_DISCARD, command.keys)
            return None
        return list(_compute_pool().map(lambda function: function(), command.functions))

    def _rpc(self, method: str, *args: Any) -> Any:
        """The first worker's answer (every worker of this engine holds the same captures)."""
        try:
            return self.llm.collective_rpc(method, args=args)[0]
        except Exception as error:
            raise driver.no_capture_error(error) or error from None


def _options(kind: type, options: Any, values: dict[str, Any]) -> Any:
    if options is not None and values:
        raise OptionError(f"give options or {', '.join(values)}, not both", next(iter(values)))
    return options if options is not None else kind.of(**values)


@functools.cache
def _compute_pool() -> ThreadPoolExecutor:
    """Threads for the drivers' NumPy and numba work (each input's DTWs use timing's own pool)."""
    return ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS, thread_name_prefix="finish")


def _samples(audio: AudioSource | np.ndarray | SpilledSamples) -> np.ndarray | SpilledSamples:
    if isinstance(audio, np.ndarray):
        return audio.astype(np.float32, copy=False)
    if isinstance(audio, SpilledSamples):
        return audio
    return decode_audio(audio, spill=True)  # a long recording is read back a window at a time
