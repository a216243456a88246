"""Live audio (pure: knows nothing of vLLM or HTTP): the policy that turns audio arriving a little at a time
into confirmed, timed words. :mod:`.agreement` confirms the words two consecutive decodes agree on
(LocalAgreement-2, as ufal/whisper_streaming); :mod:`.buffer` holds the rolling audio buffer of at most one
window, says when and what to decode, and trims the buffer at confirmed sentence ends; :mod:`.sources`
reads a file played at real time, or a pipe, as chunks. The runners
(``runners.live``) carry the decodes out on the engine.
"""
