"""The openai-whisper model both openai-whisper and stable-ts run: the converted checkpoint, fp32 on CPU,
with the HF dir's alignment heads (the checkpoint carries none). Needs torch and whisper (their venvs)."""

from __future__ import annotations

import json
from pathlib import Path


def load(checkpoint: str, hf_dir: str):
    import torch
    import whisper

    model = whisper.load_model(checkpoint, device="cpu").float().eval()
    heads = json.loads((Path(hf_dir) / "generation_config.json").read_text()).get("alignment_heads")
    if heads:  # openai-whisper's format: sparse bool (n_text_layer, n_text_head)
        mask = torch.zeros(model.dims.n_text_layer, model.dims.n_text_head, dtype=torch.bool)
        for layer, head in heads:
            mask[layer, head] = True
        model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    return model
