"""Test helper: the openai-whisper implementation of a converted model, as an independent reference.

Not a test module.  ``load_reference_model(hf_dir)`` exports the HF directory's weights with
``to_openai_whisper_checkpoint`` (cached under the temp dir by the weights' content, so that every
clone and every test's own copy of a model share one file instead of adding one per run) and
loads them with ``whisper.load_model`` in float32 on CPU, with the alignment heads from
generation_config.json installed the way openai-whisper stores them.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import torch
import whisper
import whisper.tokenizer

from vllm_whisper_align.checkpoints.ct2 import to_openai_whisper_checkpoint


def _checkpoint_path(hf_dir: Path) -> Path:
    digest = hashlib.sha256((hf_dir / "config.json").read_bytes())
    with open(hf_dir / "model.safetensors", "rb") as weights:
        key = hashlib.file_digest(weights, lambda: digest).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "vllm-whisper-align-ref" / f"{key}.pt"


def _alignment_mask(heads: list[list[int]], n_layer: int, n_head: int) -> torch.Tensor:
    """openai-whisper's format: sparse bool (n_text_layer, n_text_head), True at alignment heads."""
    mask = torch.zeros(n_layer, n_head, dtype=torch.bool)
    for layer, head in heads:
        mask[layer, head] = True
    return mask.to_sparse()


def load_reference_model(hf_dir: str | Path) -> whisper.model.Whisper:
    hf_dir = Path(hf_dir)
    ckpt = _checkpoint_path(hf_dir)
    if not ckpt.is_file():
        to_openai_whisper_checkpoint(hf_dir, ckpt)
    model = whisper.load_model(str(ckpt), device="cpu").float().eval()
    gen = json.loads((hf_dir / "generation_config.json").read_text())
    heads = gen.get("alignment_heads")
    if heads:
        dims = model.dims
        mask = _alignment_mask(heads, dims.n_text_layer, dims.n_text_head)
        model.register_buffer("alignment_heads", mask, persistent=False)
    return model


def reference_tokenizer(model: whisper.model.Whisper) -> whisper.tokenizer.Tokenizer:
    return whisper.tokenizer.get_tokenizer(
        model.is_multilingual, num_languages=model.num_languages, language="en", task="transcribe"
    )
