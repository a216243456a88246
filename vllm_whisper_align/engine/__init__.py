"""What runs inside vLLM's engine processes: the general plugin (:mod:`.plugin`), the model class
(:mod:`.model`) and its capture of the alignment heads (:mod:`.capture`), the encoder cache, the int8
encoder, engine settings, and :mod:`.vllm_internals`, the one place that touches vLLM's private
internals. Imports neither numba nor anything of the API side (tests/test_engine_defaults.py).
"""
