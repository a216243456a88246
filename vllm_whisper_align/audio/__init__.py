"""Audio in (runs on the API side, knows nothing of vLLM): :mod:`.decode` (any container to 16 kHz
mono), :mod:`.pcm` (a live stream's raw PCM16), :mod:`.windows` (≤30 s windows cut in pauses),
:mod:`.features` (speech and silence, onsets), :mod:`.phones` (English words placed by an acoustic model
of phones, in a process of its own).
"""
