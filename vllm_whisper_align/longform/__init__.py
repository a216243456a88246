"""Long-form forced alignment: splitting a transcript over the ≤30 s windows of a recording, and
joining the windows back.

Whisper aligns one 30 s window at a time, so text of any length is aligned to audio of any length in
two engine passes, each a batch of all windows (:func:`alignment_steps` drives them):

0. The short way, tried first: each window decodes only its first PREFIX_TOKENS tokens
   (:func:`hear_jobs` with ``max_tokens``), :func:`short_pass` lays each prefix on the text
   (:func:`place_prefixes`) and forces every window's share (step 3), a block of windows at a time.
   A window's words stand unless :func:`unheard_windows` finds in the second pass's own token ranks
   and word spans text the model does not hear, or an aside. Unheard words next to a boundary are
   first shared with the window across it (:func:`rezone`: a start placed wrong); windows that still
   fail and their neighbours (:func:`realign_regions`) go through steps 1-4 with the text they kept
   between them; all windows do if a share overflows the decoder:
1. :func:`hear_jobs`: the windows of ``audio.windows.audible_windows`` (cut in pauses), transcribed
   greedily without word timings: what the model hears in each.
2. :func:`split_text`: the given words are matched to the heard words (normalised, minimum edit
   distance); a matched word belongs to its heard word's window. Between two matches the unmatched
   given words are spread over the windows of the unmatched heard words between them, in proportion.
   Words near a window boundary whose side is uncertain (a *zone*) go into both windows. A long run of
   given words with hardly any heard counterpart is text that is not in the audio: aligned nowhere.
   Heard words with hardly any given counterpart are audio that is not in the text (an aside):
   :func:`extra_audio`.
3. :func:`force_jobs`: each window's share of the text, teacher-forced on that window (its audio
   carries its offset), with the heard words of any aside forced as filler in their place, so that
   the aside's frames go to them; fillers are never returned.
4. :func:`finish`: each zone is cut where the two windows' teacher-forced log-probabilities of its
   words say (a word the window's audio does not hold gets a low one), and every given word comes
   back in order: from its window, or with ``aligned: false``, a zero-length span at the previous
   aligned word's end and probability 0.

Pure: :mod:`.steps` yields jobs (hear a window, force a text on a window) and reads their typed
transcripts; ``runners.driver`` runs them for the offline API, the server and the corpus job. Modules:
:mod:`.words`, :mod:`.matching` (step 2's matching), :mod:`.split` (step 2's shares and step 4's cuts),
:mod:`.prefixes` (step 0's placement), :mod:`.check` (step 0's check and its mend), :mod:`.join`
(step 4), :mod:`.steps` (the order of it all).
"""
