"""Word- and token-level timestamps from Whisper inside vLLM's own forward.

Where code runs shows in the folders: ``engine/`` runs inside vLLM's engine processes (the plugin, the
model class that captures the alignment heads' cross-attention); everything else on the API side:
``audio/`` (decode, windows, speech features) → ``runners/`` (plan a request's windows, drive the
engine, fetch the captured attention) → ``align/`` (DTW, words, boundaries, typed results) and
``longform/`` (text of any length over many windows) → ``formats/`` (verbose_json, srt, vtt) → the
doors: ``server/`` (HTTP), ``runners.offline`` (Python), ``cli``, ``batch/`` (corpus jobs on Ray).
The top-level modules are shared facts: Whisper's constants, its tokens, and the request protocol
that travels to the engine in ``SamplingParams.extra_args``.
"""

__version__ = "0.1.0"

# The Python API, imported on first use: importing the package must not import vLLM (the CLI hides
# Triton before vLLM loads; the engine's processes import the package for its plugin).
_PUBLIC = {
    "WhisperAligner": "vllm_whisper_align.runners.offline",
    "Transcript": "vllm_whisper_align.align.results",
    "TranscriptionOptions": "vllm_whisper_align.options",
    "AlignmentOptions": "vllm_whisper_align.options",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'vllm_whisper_align' has no attribute {name!r}")
