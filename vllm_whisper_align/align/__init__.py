"""Alignment math (API side; knows nothing of vLLM or HTTP): :mod:`.timing` (cross-attention to token
times: median filter, DTW, head selection), :mod:`.words` (tokens to words, the reference's duration
rules), :mod:`.boundaries` (word boundaries moved to the audio), :mod:`.results` (typed results).
"""
