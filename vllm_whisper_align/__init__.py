"""Word- and token-level timestamps from Whisper inside vLLM's own forward.

Data path, one module each: ``audio`` (decode, 30 s chunks) → ``model`` (vLLM Whisper that keeps
the alignment heads' cross-attention) → ``capture`` (worker side: rows per request, Q·Kᵀ) →
``timing`` (softmax, z-score, median filter, DTW) → ``words`` (tokens → words) → ``transcribe``
(requests in, OpenAI-shaped results out) → ``offline`` / ``cli`` / ``server``.
"""

__version__ = "0.1.0"
