"""The request parameters' row window, the plugin's config, and the vLLM adapter's guard (no engine)."""

from __future__ import annotations

import pytest
import whisper.audio
import whisper.timing
from whisper.tokenizer import get_tokenizer

from vllm_whisper_align import constants
from vllm_whisper_align.align import timing
from vllm_whisper_align.engine import vllm_internals
from vllm_whisper_align.protocol import AlignmentParams, WhisperAlignConfig


@pytest.mark.parametrize("num_previous", [0, 5])
@pytest.mark.parametrize("multilingual", [False, True])
def test_row_window_is_the_references(num_previous, multilingual):
    """The rows sent and the text rows are those openai-whisper's find_alignment normalises and aligns:
    it builds [*sot_sequence, no_timestamps, *text, eot] and keeps matrix[len(sot_sequence):-1]."""
    tokenizer = get_tokenizer(multilingual, language="en" if multilingual else None, task="transcribe")
    start = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
    text = tokenizer.encode(" the quick brown fox")
    reference_sequence = [*start, *text, tokenizer.eot]
    reference_rows = list(range(len(reference_sequence)))[len(tokenizer.sot_sequence) : -1]

    params = AlignmentParams.for_prompt(100, num_previous, len(start))
    decoder = [*range(-num_previous, 0), *reference_sequence]  # previous-text rows come first
    sent = decoder[params.sot_row : params.sot_row + params.rows_sent(len(text))]
    assert sent == reference_sequence
    aligned_positions = list(range(len(sent)))[params.text_rows(len(text))]
    assert aligned_positions == reference_rows
    assert decoder[params.first_text_position()] == text[0]
    assert not params.has_text_rows(params.text_row) and params.has_text_rows(params.text_row + 1)


def test_alignment_params_validate():
    with pytest.raises(ValueError):
        AlignmentParams(num_frames=0).validate()
    with pytest.raises(ValueError):
        AlignmentParams(num_frames=constants.N_FRAMES + 1).validate()
    with pytest.raises(ValueError):
        AlignmentParams(num_frames=100, sot_row=2, text_row=1).validate()
    assert AlignmentParams.from_extra_args({"other": 1}) is None
    params = AlignmentParams.for_prompt(100, 2, 4)
    assert AlignmentParams.from_extra_args(params.to_extra_args({"other": 1})) == params


def test_whisper_constants_are_the_references():
    for name in (
        "SAMPLE_RATE",
        "N_FFT",
        "HOP_LENGTH",
        "N_SAMPLES",
        "N_FRAMES",
        "N_SAMPLES_PER_TOKEN",
        "TOKENS_PER_SECOND",
    ):
        assert getattr(constants, name) == getattr(whisper.audio, name), name
    assert constants.CHUNK_SECONDS == whisper.audio.CHUNK_LENGTH
    assert timing.TOKENS_PER_SECOND == whisper.timing.TOKENS_PER_SECOND
    # find_alignment's default median filter width
    assert timing.MEDFILT_WIDTH == whisper.timing.find_alignment.__kwdefaults__["medfilt_width"]


def test_unknown_plugin_options_are_refused():
    assert WhisperAlignConfig.from_additional_config(None) == WhisperAlignConfig()
    with pytest.raises(ValueError, match="unknown whisper_align options.*result_ttl"):
        WhisperAlignConfig.from_additional_config({"whisper_align": {"result_tl_s": 1}})


@pytest.mark.parametrize("value", [-1, 1.5, "64", True])
def test_encoder_cache_size_must_be_whole_mib(value):
    off = WhisperAlignConfig.from_additional_config({"whisper_align": {"encoder_cache_mib": 0}})
    assert off.encoder_cache_mib == 0
    with pytest.raises(ValueError, match="encoder_cache_mib must be a whole number of MiB"):
        WhisperAlignConfig.from_additional_config({"whisper_align": {"encoder_cache_mib": value}})


@pytest.mark.parametrize("name", ["packing", "pack_alignments", "denoise"])
def test_switches_must_be_true_or_false(name):
    assert getattr(WhisperAlignConfig.from_additional_config({"whisper_align": {name: True}}), name) is True
    with pytest.raises(ValueError, match=f"whisper_align.{name} must be true or false"):
        WhisperAlignConfig.from_additional_config({"whisper_align": {name: "yes"}})


def test_a_heavy_noise_floor_is_taken_out_by_default():
    assert WhisperAlignConfig.from_additional_config({}).denoise is True


@pytest.mark.parametrize("value", ["yes", "Auto", 1, None])
def test_dereverberate_is_true_false_or_auto(value):
    assert WhisperAlignConfig.from_additional_config({}).dereverberate == "auto"
    for good in (True, False, "auto"):
        config = WhisperAlignConfig.from_additional_config({"whisper_align": {"dereverberate": good}})
        assert config.dereverberate is good or config.dereverberate == good
    with pytest.raises(ValueError, match='whisper_align.dereverberate must be true, false or "auto"'):
        WhisperAlignConfig.from_additional_config({"whisper_align": {"dereverberate": value}})


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), 2e9, "60", True, None])
def test_urgent_head_start_must_be_seconds(value):
    for good in (0, 1, 120.5):
        config = WhisperAlignConfig.from_additional_config({"whisper_align": {"urgent_head_start_s": good}})
        assert config.urgent_head_start_s == good
    with pytest.raises(ValueError, match="urgent_head_start_s must be seconds from 0 to 1e"):
        WhisperAlignConfig.from_additional_config({"whisper_align": {"urgent_head_start_s": value}})


def test_unsupported_vllm_is_refused_with_the_supported_versions():
    vllm_internals.check_vllm()  # the installed one
    with pytest.raises(
        vllm_internals.UnsupportedVllmError, match=r"supports vLLM 0\.32\.x; this is vLLM 0\.40\.1"
    ):
        vllm_internals.check_vllm((0, 40, 1))


def test_moved_vllm_internals_are_named(monkeypatch):
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    monkeypatch.delattr(WorkerWrapperBase, "execute_model")
    with pytest.raises(vllm_internals.UnsupportedVllmError, match="WorkerWrapperBase.execute_model"):
        vllm_internals.check_vllm()


def test_kernel_override_scan_survives_numba_imported_first():
    """A script that imports this package at the top makes vLLM's workers import numba (llvmlite)
    before vLLM's Triton-override scan, which then died on llvmlite's ``ffi.lib``."""
    import sys

    import llvmlite.binding  # noqa: F401  (what importing vllm_whisper_align.timing brings)
    from vllm.triton_utils import dispatcher

    from vllm_whisper_align.engine import vllm_internals

    original = dispatcher._rebind_kernels
    try:
        dispatcher._rebind_kernels = getattr(original, "__wrapped_original__", original)
        if getattr(dispatcher._rebind_kernels, "whisper_align_guarded", False):
            pytest.skip("the guard was installed without a way back to the original")
        with pytest.raises(AttributeError):
            dispatcher._rebind_kernels([(object(), object())])
        vllm_internals.guard_kernel_override_scan()
        modules_before = set(sys.modules)
        dispatcher._rebind_kernels([(object(), object())])
        assert set(sys.modules) == modules_before
    finally:
        dispatcher._rebind_kernels = original
