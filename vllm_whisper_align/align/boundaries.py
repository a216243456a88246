"""Word boundaries moved from DTW's 20 ms frames to what the audio says: starts out of silence and
onto onsets, ends through a word's sound and its quiet tail. Not in openai-whisper; every rule and its
tuned constants live here.
"""

from __future__ import annotations

import re

import numpy as np

from vllm_whisper_align.align.words import PREPEND_PUNCTUATIONS, Word, round_time
from vllm_whisper_align.audio.features import SPEECH_FRAME_SECONDS, SpectralFlux, true_runs

# refine_starts: how far (s) a start may move to an onset; how fast an onset's pull fades with its
# distance from DTW's start (the standard deviation of a Gaussian weight, s); and how many 20 ms speech
# frames must precede a start for it to count as inside continuous speech. Chosen on a continuous-speech
# dev set (docs/boundaries.md): the strongest onset within ±60 ms beat ±40 and ±100 ms; weighing
# onsets by distance within ±120 ms beat that, σ 150 ms once quiet starts read falls (σ 80 ms before).
ONSET_SEARCH_S = 0.12
ONSET_DISTANCE_S = 0.15
ONSET_AFTER_SOUND_FRAMES = 2
# A word whose first sound is quieter than the sound before it (a stop's closure, a nasal, /w/) starts
# where the sound falls, not where new energy rises: its pull is the rise plus FALL_WEIGHT times the fall.
# Told by the first letter of English spelling, so English only (SPELLING_LANGUAGES): the same letters
# say other things in other spellings (Spanish "c" before "e" is /s/, German "w" is /v/), and other
# languages keep the rise alone. On the dev set, stops, nasals and w beat stops alone, every consonant, and
# stops with liquids; weights 1.5-3 tie.
QUIET_START_LETTERS = frozenset("bcdgkmnpqtw")
# The languages whose spelling the rules read a word's first sound from.
SPELLING_LANGUAGES = frozenset({"en"})
FALL_WEIGHT = 2.0
# snap_to_speech: the first sound in a word's span belongs to the word before when it begins this many
# frames or fewer from the span's start (DTW's own edge is a frame or two off where that sound begins).
SPAN_EDGE_FRAMES = 2
# A word's last sound that snap_to_speech took for the next word's head, and that the next word, starting
# after a silence, took for this word's tail, is this word's when at most this long a silence parts it
# from the rest of the word (a stop's closure: "doc-tor", "kitch-en"); further off it is a word Whisper
# did not write, and stays no word's.
CODA_GAP_S = 0.2
# extend_ends: how far (s) an end may run on through a word's quiet tail past the speech mask.
TAIL_MAX_S = 0.15
# extend_ends_through_hiss: a word's end runs on through hiss (audio.features.hiss_frames: a final /s/,
# /z/, /f/, a stop's release) that begins within HISS_GAP_FRAMES of it (a stop's closure) and keeps no
# longer silence inside, up to HISS_MAX_S past the end. Chosen on the real sets (docs/boundaries.md).
HISS_GAP_FRAMES = 3
HISS_MAX_S = 0.3
# extend_starts_through_hiss, the mirror: an English word spelled with a fricative or /h/ first (these
# letters, matched at its start; SPELLING_LANGUAGES) starts back through the hiss before it, with the
# same two constants. Read from the spelling because a breath in a pause is hiss too.
HISS_START_LETTERS = re.compile(r"[sfzhx]|th|ch|ph|c[eiy]")
# extend_starts: how far (s) a start after a pause may run back through the word's quiet head (an /h/,
# /s/ or /f/ before the voice) that the speech mask leaves out.
HEAD_MAX_S = 0.1


def snap_to_speech(
    words: list[Word],
    speech: np.ndarray,
    offset: float,
    frame_seconds: float = SPEECH_FRAME_SECONDS,
    neighbour_sound: bool = False,
) -> None:
    """Move word starts forward out of silence and word ends back out of it, in place.

    Not in the reference: DTW hands the silence before a word to that word (and a clip's leading
    silence to its first word, whose path must start at frame 0). ``speech`` is a per-frame mask
    of the audio that starts at ``offset`` seconds; a word keeps at least one frame.

    ``neighbour_sound``: the selected heads (``timing.select_heads``) move on to the next token as
    soon as a word's sound ends, so a word's span can begin in the tail of the word before it and
    end in the head of the word after it. Then sound at the start of a span (within SPAN_EDGE_FRAMES)
    that is followed by a silence belongs to the previous word (the word starts after that silence),
    and likewise at the end; sound that both neighbours so disown goes to the word before
    (:func:`_claim_dropped_codas`). Without it the word is simply trimmed to the sound it covers.
    """

    def frame(seconds: float) -> int:
        return int(round((seconds - offset) / frame_seconds))

    spans = [(word.start, word.end) for word in words]
    for word in words:
        first, last = frame(word.start), frame(word.end)  # [first, last) frames of the word
        if not 0 <= first < last <= len(speech) or speech[first:last].all():
            continue
        starts, ends = true_runs(speech[first:last])
        voiced = list(zip(starts.tolist(), ends.tolist(), strict=True))  # [start, end) of each sound
        if not voiced:
            continue  # no sound under the word at all: leave DTW's answer
        start_run, end_run = voiced[0], voiced[-1]
        if neighbour_sound and len(voiced) > 1:
            if start_run[0] <= SPAN_EDGE_FRAMES:
                start_run = voiced[1]
            if end_run[1] == last - first:
                end_run = voiced[-2]
            if end_run[1] <= start_run[0]:
                end_run = start_run
        word.start = round_time(offset + (first + start_run[0]) * frame_seconds)
        word.end = round_time(offset + (first + end_run[1]) * frame_seconds)
    if neighbour_sound:
        _claim_dropped_codas(words, spans, speech, offset, frame_seconds)


def _claim_dropped_codas(
    words: list[Word],
    spans: list[tuple[float, float]],
    speech: np.ndarray,
    offset: float,
    frame_seconds: float,
) -> None:
    """Give a word back the sound between it and the next word that both disowned: sound that begins
    inside the word's span (``spans``: before snapping) within ``CODA_GAP_S`` of its end, and ends in a
    silence before the next word. The end rule took it for the next word's head, the next word's start
    rule for this word's tail. In place."""
    max_gap = int(round(CODA_GAP_S / frame_seconds))
    for word, following, (_, span_end) in zip(words, words[1:], spans, strict=False):
        end = int(round((word.end - offset) / frame_seconds))
        start = int(round((following.start - offset) / frame_seconds))
        if not 0 <= end < start <= len(speech):
            continue
        runs = true_runs(speech[end:start])
        if not len(runs[0]):
            continue
        run_start, run_end = end + int(runs[0][0]), end + int(runs[1][0])
        parted = run_end < start  # a silence before the next word: not the next word's own sound
        if parted and run_start - end <= max_gap and offset + run_start * frame_seconds < span_end:
            word.end = round_time(offset + run_end * frame_seconds)


def extend_ends_through_hiss(
    words: list[Word], hiss: np.ndarray, offset: float, frame_seconds: float = SPEECH_FRAME_SECONDS
) -> None:
    """Move each end on through the hiss that follows it (``hiss``: ``audio.features.hiss_frames``, same
    frames as the speech mask), in place.

    A word's last sound can be a fricative or a stop's release ("corpus", "words", "that"): power above
    the voice's band that the speech mask leaves out, often after a closure of silence, so
    :func:`extend_ends` stops before it (real recordings' ends before a pause: 0.1-0.3 s early). The end
    runs on through hiss that begins within ``HISS_GAP_FRAMES`` of it, across silences no longer, up to
    ``HISS_MAX_S``. Not where the hiss runs on into the next word: it may be that word's own head (an /s/
    the next word's start was placed after).
    """
    for index, word in enumerate(words):
        end = int(round((word.end - offset) / frame_seconds))
        limit = _next_start_frame(words, index, offset, frame_seconds, len(hiss))
        reach = min(limit, end + int(round(HISS_MAX_S / frame_seconds)))
        if not 0 < end < reach:
            continue
        farthest, ran_out = _hiss_walk(hiss, range(end, reach))
        if ran_out and reach == limit:
            continue  # the hiss runs on into the next word
        if farthest is not None:
            word.end = round_time(offset + (farthest + 1) * frame_seconds)


def extend_starts_through_hiss(
    words: list[Word],
    hiss: np.ndarray,
    offset: float,
    language: str | None,
    frame_seconds: float = SPEECH_FRAME_SECONDS,
) -> None:
    """Move the start of each word that :func:`starts_with_hiss` back through the hiss before it, in
    place: the mirror of :func:`extend_ends_through_hiss`.

    An /s/, /f/ or /h/ head is power above the voice's band, so ``snap_to_speech`` put the start on the
    voice after it (spontaneous speech: "speech", "saying" 0.1 s late). The start runs back through hiss
    that ends within ``HISS_GAP_FRAMES`` of it, across silences no longer, up to ``HISS_MAX_S``. Not where
    the hiss runs back into the previous word: it may be that word's own coda.
    """
    for index, word in enumerate(words):
        if not starts_with_hiss(word.word, language):
            continue
        start = int(round((word.start - offset) / frame_seconds))
        limit = _previous_end_frame(words, index, offset, frame_seconds)
        reach = max(limit, start - int(round(HISS_MAX_S / frame_seconds)))
        if not reach < start <= len(hiss):
            continue
        farthest, ran_out = _hiss_walk(hiss, range(start - 1, reach - 1, -1))
        if ran_out and reach == limit:
            continue  # the hiss runs back into the previous word
        if farthest is not None:
            word.start = round_time(offset + farthest * frame_seconds)


def _hiss_walk(hiss: np.ndarray, frames: range) -> tuple[int | None, bool]:
    """Walk ``frames`` away from a word's edge through hiss, across silences of at most
    ``HISS_GAP_FRAMES``: the farthest frame of hiss reached (None: none), and whether the walk ran out of
    frames still in the hiss (a longer silence did not stop it)."""
    gap, farthest = 0, None
    for at in frames:
        if hiss[at]:
            gap, farthest = 0, at
        else:
            gap += 1
            if gap > HISS_GAP_FRAMES:
                return farthest, False
    return farthest, True


def _previous_end_frame(words: list[Word], index: int, offset: float, frame_seconds: float) -> int:
    """The frame the word before ``words[index]`` ends at, at least 0 (before the first word: 0)."""
    if index == 0:
        return 0
    return max(0, int(round((words[index - 1].end - offset) / frame_seconds)))


def _next_start_frame(words: list[Word], index: int, offset: float, frame_seconds: float, length: int) -> int:
    """The frame the word after ``words[index]`` starts at, at most ``length`` (after the last word: it)."""
    if index + 1 == len(words):
        return length
    return min(length, int(round((words[index + 1].start - offset) / frame_seconds)))


def extend_starts(
    words: list[Word],
    speech: np.ndarray,
    offset: float,
    sound: np.ndarray,
    frame_seconds: float = SPEECH_FRAME_SECONDS,
) -> None:
    """Move each start that follows a pause back through the word's quiet head, in place: the mirror of
    :func:`extend_ends`' quiet tail.

    A word that begins unvoiced (an /h/, /s/, /f/, a breathy onset) begins below the speech mask's level,
    so ``snap_to_speech`` put its start on its voice. ``sound`` (``audio.features.sound_frames``) marks
    that quieter sound: the start runs back through it when it begins after silence within
    ``HEAD_MAX_S`` (sound that goes on further back is room tone or the word before, not a head), and
    never before the previous word's end.
    """
    for index, word in enumerate(words):
        start = int(round((word.start - offset) / frame_seconds))
        if not 0 < start < min(len(speech), len(sound)) or not speech[start] or speech[start - 1]:
            continue  # not a start at the edge of a pause
        lowest = _previous_end_frame(words, index, offset, frame_seconds)
        reach = max(lowest, start - int(round(HEAD_MAX_S / frame_seconds)))
        # the frames before the start, nearest first, with one more past the reach to see where it begins
        before = sound[max(0, reach - 1) : start][::-1]
        silent = np.flatnonzero(~before)
        if len(silent):
            head = int(silent[0])
        elif reach == 0:
            head = start  # the head runs back to the input's first frame
        else:
            continue
        word.start = round_time(offset + (start - head) * frame_seconds)


def join_ends(
    words: list[Word], speech: np.ndarray, offset: float, frame_seconds: float = SPEECH_FRAME_SECONDS
) -> None:
    """A word that runs into the next through sound (no silence between them) ends where the next
    begins, in place.

    In continuous speech the selected heads leave a word as its sound fades, a frame or more before the
    next word begins (on real speech: ends a median of 30 ms early), and no pause says where it ends:
    the word ends where the next begins, as every aligner and hand labelling lays out words that run
    into each other. Before a pause, ``extend_ends`` decides.
    """
    for word, following in zip(words, words[1:], strict=False):
        end = int(round((word.end - offset) / frame_seconds))
        start = int(round((following.start - offset) / frame_seconds))
        if start <= end or (0 <= end < start <= len(speech) and speech[end:start].all()):
            word.end = following.start


def starts_quietly(word: str, language: str | None) -> bool:
    """Whether ``word`` (as decoded: a leading space, maybe opening punctuation) of an English text begins
    with one of ``QUIET_START_LETTERS``."""
    letters = word.lstrip().lstrip(PREPEND_PUNCTUATIONS)
    return language in SPELLING_LANGUAGES and letters[:1].lower() in QUIET_START_LETTERS


def starts_with_hiss(word: str, language: str | None) -> bool:
    """Whether ``word`` (as decoded) of an English text is spelled with a fricative or /h/ first
    (``HISS_START_LETTERS``)."""
    letters = word.lstrip().lstrip(PREPEND_PUNCTUATIONS).lower()
    return language in SPELLING_LANGUAGES and HISS_START_LETTERS.match(letters) is not None


def refine_starts(
    words: list[Word],
    flux: SpectralFlux,
    speech: np.ndarray,
    offset: float,
    onset_seconds: float,
    speech_seconds: float = SPEECH_FRAME_SECONDS,
    language: str | None = "en",
) -> None:
    """Move each start that follows sound to the strongest onset within ``ONSET_SEARCH_S`` of it, each
    onset's strength weighed by its distance from the start (a Gaussian of ``ONSET_DISTANCE_S``); the
    start goes to the frame that onset rises from.

    DTW only knows 20 ms encoder frames, and in continuous speech (no silence to snap to) its start
    can sit a frame or more off the real one. ``flux`` is the audio's spectral rises and falls per
    frame of ``onset_seconds`` (``audio.features.spectral_flux``): a word's onset strength is the rise,
    plus ``FALL_WEIGHT`` times the fall where the word :func:`starts_quietly` (``language``: the text's).
    ``speech`` is the speech mask per ``speech_seconds``; both start at ``offset``. Starts after
    silence are left alone (``snap_to_speech`` placed them on the sound's first frame), and a start
    never moves before the previous word's end or to the word's end. In place.
    """
    quiet_onsets = flux.rises + np.float32(FALL_WEIGHT) * flux.falls
    previous_end = None
    for word in words:
        original_end = word.end
        onsets = quiet_onsets if starts_quietly(word.word, language) else flux.rises
        speech_frame = int(round((word.start - offset) / speech_seconds))
        before = speech[max(0, speech_frame - ONSET_AFTER_SOUND_FRAMES) : speech_frame]
        if speech_frame > 0 and len(before) and before.all():
            low = word.start - ONSET_SEARCH_S
            if previous_end is not None:
                low = max(low, previous_end)
            high = min(word.start + ONSET_SEARCH_S, word.end - onset_seconds)
            first = max(0, int(round((low - offset) / onset_seconds)))
            last = min(len(onsets) - 1, int(round((high - offset) / onset_seconds)))
            current = int(round((word.start - offset) / onset_seconds))
            if last > first and 0 <= current < len(onsets):
                distance = (np.arange(first, last + 1) - current) * onset_seconds
                pull = onsets[first : last + 1] * np.exp(-0.5 * (distance / ONSET_DISTANCE_S) ** 2)
                peak = first + int(np.argmax(pull))
                if pull[peak - first] > onsets[current]:  # nothing pulls harder than where it is: stay
                    # The word starts at the frame its strongest rise comes from (frame k's rise is
                    # measured from frame k - 1): a real onset rises over several frames, and the
                    # sound is there before the frame of its steepest rise.
                    word.start = round_time(offset + max(first, peak - 1) * onset_seconds)
        previous_end = original_end


def extend_ends(
    words: list[Word],
    speech: np.ndarray,
    offset: float,
    frame_seconds: float = SPEECH_FRAME_SECONDS,
    sound: np.ndarray | None = None,
) -> None:
    """Move each end that falls inside sound forward to where that sound stops, then on through the
    word's quiet tail, in place.

    The selected heads leave a word early, while its sound still goes on (on speech with pauses
    their ends were ~110 ms early, median). Where the sound under a word's end stops before the
    next word starts (a pause), the word ends there; in continuous speech there is no such pause
    and the end stays. ``speech`` as in :func:`snap_to_speech`. ``sound`` (``audio.features.sound_frames``,
    same frames) marks the quieter sound that the speech mask leaves out: an end at the edge of the
    speech mask runs on through it, up to ``TAIL_MAX_S`` and never to the next word's start.
    """
    for index, word in enumerate(words):
        end = int(round((word.end - offset) / frame_seconds))
        limit = _next_start_frame(words, index, offset, frame_seconds, len(speech))
        if not 0 < end < limit or not speech[end - 1]:
            continue
        quiet = np.flatnonzero(~speech[end:limit])
        if not len(quiet):
            continue
        end += int(quiet[0])
        if sound is not None:
            tail_limit = min(limit, len(sound), end + int(round(TAIL_MAX_S / frame_seconds)))
            silent = np.flatnonzero(~sound[end:tail_limit])
            if len(silent):  # the tail ends before the next word (or the limit): end there
                end += int(silent[0])
        word.end = round_time(offset + end * frame_seconds)
