"""What the tests and the benchmarks share: synthetic speech with known word boundaries (``speech``,
``espeak_events``), silent files (``silence``), openai-whisper as the reference (``reference``),
servers started for a test (``servers``), and subtitle files (``subtitles``)."""
