"""What a request carries to the engine, and the plugin's engine-wide configuration.

Per request, :class:`AlignmentParams` travel in ``SamplingParams.extra_args[EXTRA_ARGS_KEY]`` as a
plain dict, because that is the one per-request channel vLLM forwards untouched from the API process
to the model runner (it is msgpack serialised on the way, so only plain types go in it). They also own
the decoder *row window*: which rows of the decoder sequence are captured, sent back and aligned.

Per engine, :class:`WhisperAlignConfig` comes from ``--additional-config '{"whisper_align": {...}}'``.
Like vLLM's own config types, it lives here and flows down: the model imports it, never the reverse.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from vllm_whisper_align.audio.denoise import DEFAULT_ON
from vllm_whisper_align.audio.dereverb import AUTO, DEFAULT_MODE, Mode
from vllm_whisper_align.constants import MAX_DECODER_TOKENS, N_FRAMES
from vllm_whisper_align.options import DEFAULT_ALIGNMENT_METHOD, method_named

EXTRA_ARGS_KEY = "whisper_align"
NO_SPEECH_EXTRA_ARGS_KEY = "whisper_align_no_speech"

# Names of the worker methods the API side calls through collective_rpc (the plugin installs them).
RPC_FETCH = "whisper_align_fetch"
RPC_DISCARD = "whisper_align_discard"
RPC_STATS = "whisper_align_stats"
RPC_NO_SPEECH = "whisper_align_no_speech"
RPC_RETURN_IDLE_MEMORY = "whisper_align_return_idle_memory"
RPC_CLEAR_ENCODER_CACHE = "whisper_align_clear_encoder_cache"
NO_CAPTURE_MESSAGE = "this engine does not capture alignment heads (not a Whisper model, or TP > 1)"

# Width of the median filter along frames (openai-whisper's find_alignment default). Here rather than
# in timing.py, which uses it, so that the engine's processes, which import this module, do not
# import numba: timing's kernels run on the API side only.
MEDFILT_WIDTH = 7


def new_alignment_key() -> str:
    return uuid.uuid4().hex


@dataclass
class AlignmentParams:
    """Asks the engine to capture cross-attention for one request.

    The decoder sequence of a request is ``[prev…] [sot…, no_timestamps] [text…] [eot]``:

    - rows before ``sot_row`` (a ``<|startofprev|>`` prompt) are never sent back: the reference
      (openai-whisper ``find_alignment``) does not normalise over them;
    - rows ``sot_row`` to the eot row travel (:meth:`rows_sent`) and are normalised together;
    - rows ``text_row`` to the last text token (:meth:`text_rows`) predict the text tokens and eot:
      they are the DTW's input.

    The capture is keyed by ``key`` rather than by vLLM's request id, because the engine appends a
    random suffix to the id the caller chose; the caller keeps ``key`` to fetch the timings.
    """

    # Mel frames of the real (unpadded) audio; softmax runs over num_frames // 2 encoder frames.
    num_frames: int
    # Decoder row of <|startoftranscript|>.
    sot_row: int = 0
    # Decoder row whose output predicts the first text token (the <|notimestamps|> row).
    text_row: int = 1
    key: str = field(default_factory=new_alignment_key)
    medfilt_width: int = MEDFILT_WIDTH
    qk_scale: float = 1.0
    alignment_method: str = DEFAULT_ALIGNMENT_METHOD

    @classmethod
    def for_prompt(
        cls, num_frames: int, num_previous: int, num_start: int, **options: Any
    ) -> AlignmentParams:
        """Rows of a prompt of ``num_previous`` ``<|startofprev|>`` tokens, then ``num_start`` start
        tokens (``<|startoftranscript|>`` … ``<|notimestamps|>``), then the text."""
        return cls(num_frames, sot_row=num_previous, text_row=num_previous + num_start - 1, **options)

    def rows_sent(self, num_text_tokens: int) -> int:
        """Rows from ``sot_row`` the worker sends back: [sot…, no_timestamps, text…, eot]."""
        return self.text_row - self.sot_row + num_text_tokens + 2

    def text_rows(self, num_text_tokens: int) -> slice:
        """Of the rows sent, those whose outputs predict the text tokens and eot."""
        start = self.text_row - self.sot_row
        return slice(start, start + num_text_tokens + 1)

    def first_text_position(self) -> int:
        """Decoder position of the first text token (its prompt log-probability sits there)."""
        return self.text_row + 1

    def has_text_rows(self, num_rows: int) -> bool:
        """Whether ``num_rows`` captured decoder rows reach past the start tokens."""
        return num_rows > self.text_row

    def validate(self) -> None:
        if not 0 < self.num_frames <= N_FRAMES:
            raise ValueError(f"num_frames must be in 1..{N_FRAMES} (one 30 s window), got {self.num_frames}")
        if not 0 <= self.sot_row < self.text_row < MAX_DECODER_TOKENS:
            raise ValueError(f"need 0 <= sot_row < text_row < {MAX_DECODER_TOKENS}")
        if self.medfilt_width < 1 or self.medfilt_width % 2 == 0:
            raise ValueError("medfilt_width must be a positive odd number")
        method_named(self.alignment_method)

    def to_extra_args(self, extra_args: dict[str, Any] | None = None) -> dict[str, Any]:
        self.validate()
        merged = dict(extra_args or {})
        merged[EXTRA_ARGS_KEY] = asdict(self)
        return merged

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> AlignmentParams | None:
        if not extra_args or EXTRA_ARGS_KEY not in extra_args:
            return None
        return cls(**extra_args[EXTRA_ARGS_KEY])


@dataclass
class NoSpeechParams:
    """Asks the engine for openai-whisper's ``no_speech_prob`` of one request: the probability of
    the no-speech token as the prediction of decoder row ``row`` (``<|startoftranscript|>``).

    vLLM's ``prompt_logprob_token_ids`` would give it, but only on its V2 model runner, which the
    CPU backend does not use; so the worker reads it from the decoder's output (see engine/capture.py).
    """

    row: int
    token: int
    key: str = field(default_factory=new_alignment_key)

    def to_extra_args(self, extra_args: dict[str, Any] | None = None) -> dict[str, Any]:
        if not 0 <= self.row < MAX_DECODER_TOKENS - 1:
            raise ValueError(f"no-speech row must be in 0..{MAX_DECODER_TOKENS - 2}, got {self.row}")
        return {**(extra_args or {}), NO_SPEECH_EXTRA_ARGS_KEY: asdict(self)}

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> NoSpeechParams | None:
        if not extra_args or NO_SPEECH_EXTRA_ARGS_KEY not in extra_args:
            return None
        return cls(**extra_args[NO_SPEECH_EXTRA_ARGS_KEY])


@dataclass
class AlignmentRequest:
    """What the API side asks the worker for once a request has produced its tokens.

    ``num_text_tokens`` says how many rows after ``text_row`` belong to the text: the engine may have
    fed one more row than that (async scheduling runs a finished request once more), and a request
    cut by max_tokens never feeds its last token.
    """

    key: str
    num_text_tokens: int


# Finished requests whose timings nobody fetched (a client that went away) are dropped after this
# many seconds, or when more than MAX_PARKED wait.
RESULT_TTL_S = 300.0
MAX_PARKED = 4096
# Encoder outputs kept for the next request on the same audio (vllm_whisper_align.encoder_cache), in
# MiB; 0 turns the cache off. A window's output is 1500 frames x d_model: 1.1 MiB for tiny.en in
# bfloat16, 2.3 MiB in float32, 7.5 MiB for large-v3 in float32. 256 MiB holds a 5-minute recording's
# windows between the two passes of its alignment for any model, and 233 windows of tiny.en's in
# bfloat16 (1.9 hours of the benchmark's speech, cut into windows of 27 s on average).
ENCODER_CACHE_MIB = 256
# How far (s) an urgent request (one window or less, a live decode) goes ahead of the windows of longer
# files begun before it, and so about how long a flood of urgent requests can hold a file back
# (runners.service.engine_priority).
URGENT_HEAD_START_S = 120.0
MAX_HEAD_START_S = 1e9  # ~32 years: "always first", and a priority that stays an integer


@dataclass
class WhisperAlignConfig:
    """``--additional-config '{"whisper_align": {...}}'``: engine-side options of the plugin."""

    # How long (s) and how many finished requests' matrices wait in host memory for their fetch.
    result_ttl_s: float = RESULT_TTL_S
    max_parked: int = MAX_PARKED
    # Encoder linear layers in int8 (CPU only; see vllm_whisper_align.engine.int8).
    encoder_int8: bool = False
    # Encoder outputs kept for a repeat of the same window (CPU only; see ENCODER_CACHE_MIB).
    encoder_cache_mib: int = ENCODER_CACHE_MIB
    # Short transcriptions that wait for the engine together share a window (runners.packing).
    packing: bool = True
    # Short forced alignments too: faster, but their starts are read a little less well (docs/packing.md).
    pack_alignments: bool = False
    # A room's late reverberation taken out of each window of 5 s or more before the acoustic model of
    # phones reads it (audio.dereverb): word edges nearer in reverberant rooms, about twice the model's
    # CPU where it runs. "auto": in the windows where a first estimate finds a tail; true: every one
    # (docs/boundaries.md#reverberation-2026-12-06).
    dereverberate: Mode = DEFAULT_MODE
    # A steady noise floor (hiss, hum, a fan) taken out of each window the acoustic model reads, where it
    # is within 13 dB of the speech and no reverberation was taken out (audio.denoise): word edges
    # nearer in noise (docs/boundaries.md#a-noise-floor-taken-out-2026-12-07).
    denoise: bool = DEFAULT_ON
    # Seconds an urgent request goes ahead of longer files' windows (URGENT_HEAD_START_S).
    urgent_head_start_s: float = URGENT_HEAD_START_S

    @classmethod
    def from_additional_config(cls, additional_config: dict | None) -> WhisperAlignConfig:
        options = (additional_config or {}).get(EXTRA_ARGS_KEY) or {}
        if not isinstance(options, dict):
            raise ValueError("additional_config's whisper_align must be an object of options")
        known = [f.name for f in fields(cls)]
        unknown = set(options) - set(known)
        if unknown:
            raise ValueError(
                f"unknown whisper_align options in additional_config: {sorted(unknown)}; known: {known}"
            )
        config = cls(**options)
        for name in ("packing", "pack_alignments", "denoise"):
            if not isinstance(getattr(config, name), bool):
                raise ValueError(f"whisper_align.{name} must be true or false, got {getattr(config, name)!r}")
        if not (isinstance(config.dereverberate, bool) or config.dereverberate == AUTO):
            raise ValueError(
                f'whisper_align.dereverberate must be true, false or "auto", got {config.dereverberate!r}'
            )
        if (
            isinstance(config.encoder_cache_mib, bool)
            or not isinstance(config.encoder_cache_mib, int)
            or config.encoder_cache_mib < 0
        ):
            raise ValueError(
                "whisper_align.encoder_cache_mib must be a whole number of MiB >= 0, got "
                f"{config.encoder_cache_mib!r}"
            )
        head_start = config.urgent_head_start_s
        number = isinstance(head_start, (int, float)) and not isinstance(head_start, bool)
        if not number or not 0 <= head_start <= MAX_HEAD_START_S:
            raise ValueError(
                f"whisper_align.urgent_head_start_s must be seconds from 0 to {MAX_HEAD_START_S:g}, "
                f"got {head_start!r}"
            )
        return config
