"""Results written out (:mod:`.responses`: json, verbose_json, text, srt, vtt), subtitles read in
(:mod:`.subtitles`) and re-timed (:mod:`.retiming`).
"""
