"""Moving word boundaries out of silence: the speech mask and the snapping rule."""

import numpy as np
import pytest

from tests.support.speech import synthesize_words
from vllm_whisper_align.align.boundaries import (
    CODA_GAP_S,
    HISS_GAP_FRAMES,
    HISS_MAX_S,
    SPAN_EDGE_FRAMES,
    extend_ends,
    extend_ends_through_hiss,
    extend_starts,
    extend_starts_through_hiss,
    join_ends,
    refine_starts,
    snap_to_speech,
    starts_quietly,
    starts_with_hiss,
)
from vllm_whisper_align.align.words import Word
from vllm_whisper_align.audio.features import SpectralFlux, hiss_frames, speech_frames


def test_speech_mask_marks_words_and_gaps():
    clip = synthesize_words(["hello", "world"], gap_s=0.5, lead_s=0.5)
    speech = speech_frames(clip.samples)
    for start, end in zip(clip.starts, clip.ends, strict=True):
        inside = speech[int(start / 0.02) + 1 : int(end / 0.02) - 1]
        assert inside.mean() > 0.9
    gap = speech[int(clip.ends[0] / 0.02) + 2 : int(clip.starts[1] / 0.02) - 1]
    assert not gap.any()
    assert not speech[: int(0.5 / 0.02) - 1].any()


def test_speech_mask_with_noise_still_finds_the_gap():
    clip = synthesize_words(["hello", "world"], gap_s=0.5, noise_db=-45, seed=1)
    speech = speech_frames(clip.samples)
    gap = speech[int(clip.ends[0] / 0.02) + 2 : int(clip.starts[1] / 0.02) - 1]
    assert gap.mean() < 0.2


def test_snap_moves_boundaries_out_of_silence_only():
    speech = np.array([0] * 25 + [1] * 20 + [0] * 10 + [1] * 20, dtype=bool)  # 20 ms frames
    words = [
        Word(0.0, 0.9, " a", 1.0, [1]),  # silent 0.0-0.5, sound 0.5-0.9
        Word(0.9, 1.5, " b", 1.0, [2]),  # silent 0.9-1.1, sound 1.1-1.5
        Word(1.2, 1.3, " c", 1.0, [3]),  # all sound: unchanged
    ]
    snap_to_speech(words, speech, offset=10.0 - 10.0)
    assert (words[0].start, words[0].end) == (0.5, 0.9)
    assert (words[1].start, words[1].end) == (1.1, 1.5)
    assert (words[2].start, words[2].end) == (1.2, 1.3)


def test_snap_leaves_words_over_pure_silence_and_respects_offset():
    speech = np.array([0] * 10 + [1] * 10, dtype=bool)
    silent = Word(30.0, 30.1, " x", 1.0, [1])
    late = Word(30.1, 30.4, " y", 1.0, [2])
    snap_to_speech([silent, late], speech, offset=30.0)
    assert (silent.start, silent.end) == (30.0, 30.1)
    assert (late.start, late.end) == (30.2, 30.4)


def test_neighbour_sound_skips_the_previous_and_next_words_tails():
    # sound 0.0-0.4 (the word before), silence 0.4-0.7, the word 0.7-1.1, silence 1.1-1.3, next word
    speech = np.array([1] * 20 + [0] * 15 + [1] * 20 + [0] * 10 + [1] * 20, dtype=bool)
    plain = Word(0.3, 1.4, " w", 1.0, [1])
    sharp = Word(0.3, 1.4, " w", 1.0, [1])
    snap_to_speech([plain], speech, 0.0)
    snap_to_speech([sharp], speech, 0.0, neighbour_sound=True)
    assert (plain.start, plain.end) == (0.3, 1.4)  # trimmed only to the sound it covers
    assert (sharp.start, sharp.end) == (0.7, 1.1)


def test_neighbour_sound_keeps_a_word_that_is_only_sound_then_silence():
    speech = np.array([1] * 20 + [0] * 20, dtype=bool)
    word = Word(0.1, 0.6, " w", 1.0, [1])
    snap_to_speech([word], speech, 0.0, neighbour_sound=True)
    assert (word.start, word.end) == (0.1, 0.4)


def test_neighbour_sound_a_frame_or_two_into_the_span_still_belongs_to_the_word_before():
    """DTW's edge sits a frame or two off where the previous word's tail begins: that tail, then silence,
    is still the word before's, up to SPAN_EDGE_FRAMES in; further in, the sound is the word's own."""
    for lead in range(SPAN_EDGE_FRAMES + 2):
        # span from frame 10; sound from frame 10 + lead to 20, silence to 30, the word 30-50
        speech = np.array([0] * (10 + lead) + [1] * (10 - lead) + [0] * 10 + [1] * 20, dtype=bool)
        word = Word(0.2, 1.0, " w", 1.0, [1])
        snap_to_speech([word], speech, 0.0, neighbour_sound=True)
        expected = 0.6 if lead <= SPAN_EDGE_FRAMES else round(0.2 + lead * 0.02, 2)
        assert word.start == expected, lead


def _coda_then_pause(closure_frames: int) -> np.ndarray:
    """ "doc" 0.2-0.4 s, a closure, "tor" from after it to 0.9 s, a pause, the next word 1.2-1.6 s."""
    return np.array(
        [0] * 10 + [1] * 10 + [0] * closure_frames + [1] * (25 - closure_frames) + [0] * 15 + [1] * 20,
        dtype=bool,
    )


def test_a_words_last_sound_both_neighbours_disown_goes_to_the_word():
    """DTW ends "doctor" inside its "tor" (0.8 s), so the end rule takes "tor" for the next word's head;
    the next word's span begins in it too, and "tor" is followed by a pause, so its start rule takes
    "tor" for the tail of the word before. "tor" was then no word's, and "doctor" ended at "doc"."""
    for closure in (5, 7, int(round(CODA_GAP_S / 0.02))):
        speech = _coda_then_pause(closure)
        words = [Word(0.1, 0.8, " doctor", 1.0, [1]), Word(0.8, 1.6, " asked", 1.0, [2])]
        snap_to_speech(words, speech, 0.0, neighbour_sound=True)
        assert (words[0].start, words[0].end) == (0.2, 0.9), closure
        assert (words[1].start, words[1].end) == (1.2, 1.6), closure


def test_sound_far_from_the_word_before_stays_no_words():
    """Sound a longer silence away is a word Whisper did not write: the word before does not run on over
    it."""
    speech = _coda_then_pause(int(round(CODA_GAP_S / 0.02)) + 1)
    words = [Word(0.1, 0.8, " doctor", 1.0, [1]), Word(0.8, 1.6, " asked", 1.0, [2])]
    snap_to_speech(words, speech, 0.0, neighbour_sound=True)
    assert words[0].end == 0.4
    assert words[1].start == 1.2


def test_sound_that_runs_on_into_the_next_word_stays_the_next_words():
    """Where the sound goes on without a silence into the next word (whose span begins inside it), it is
    that word's head, as the end rule said: the word before does not take it."""
    speech = np.array([0] * 10 + [1] * 10 + [0] * 7 + [1] * 33 + [0] * 10, dtype=bool)
    words = [Word(0.1, 0.8, " the", 1.0, [1]), Word(0.8, 1.2, " children", 1.0, [2])]
    snap_to_speech(words, speech, 0.0, neighbour_sound=True)
    assert (words[0].end, words[1].start) == (0.4, 0.8)


def test_hiss_is_sound_above_the_voice_over_a_floor_of_rumble():
    """A final /s/ over a recording whose floor is rumble: the band above 3 kHz holds the /s/, and the
    rumble, however loud, is no hiss."""
    rng = np.random.default_rng(3)
    t = np.arange(16000) / 16000
    rumble = 0.05 * np.sin(2 * np.pi * 60 * t) + 0.002 * rng.standard_normal(16000)
    s = np.diff(rng.standard_normal(16001)) * 0.02  # white noise differenced: its power rises with frequency
    audio = rumble.copy()
    audio[8000:11200] += s[8000:11200]  # 0.5-0.7 s
    hiss = hiss_frames(audio.astype(np.float32))
    assert hiss[26:34].all()  # inside the /s/
    assert not hiss[:24].any() and not hiss[36:].any()


def _hiss(*runs: tuple[int, int], length: int = 100) -> np.ndarray:
    mask = np.zeros(length, dtype=bool)
    for start, stop in runs:
        mask[start:stop] = True
    return mask


def test_an_end_runs_on_through_hiss_after_a_closure():
    """ "corpus": the speech mask ends at "cor" (0.4 s), a closure, then "-pus"'s /s/ as hiss."""
    for gap in range(HISS_GAP_FRAMES + 1):
        word = Word(0.1, 0.4, " corpus", 1.0, [1])
        extend_ends_through_hiss([word], _hiss((20 + gap, 30 + gap)), 0.0)
        assert word.end == round(0.6 + gap * 0.02, 2), gap
    word = Word(0.1, 0.4, " corpus", 1.0, [1])
    extend_ends_through_hiss([word], _hiss((21 + HISS_GAP_FRAMES, 40)), 0.0)
    assert word.end == 0.4  # a longer silence: the hiss is no part of the word


def test_hiss_that_runs_on_into_the_next_word_stays_its_head():
    """ "was so": hiss up to the next word's start may be that word's /s/, which its start was put after."""
    words = [Word(0.1, 0.4, " was", 1.0, [1]), Word(0.6, 0.9, " so", 1.0, [2])]
    extend_ends_through_hiss(words, _hiss((21, 30)), 0.0)
    assert words[0].end == 0.4
    words = [Word(0.1, 0.4, " was", 1.0, [1]), Word(0.8, 0.9, " so", 1.0, [2])]
    extend_ends_through_hiss(words, _hiss((21, 30)), 0.0)  # a silence before the next word
    assert words[0].end == 0.6


def test_an_end_runs_through_hiss_no_further_than_hiss_max_s():
    word = Word(0.1, 0.4, " yes", 1.0, [1])
    extend_ends_through_hiss([word], _hiss((20, 90)), 0.0)
    assert word.end == round(0.4 + HISS_MAX_S, 2)


def test_a_start_runs_back_through_its_hiss():
    """ "speech": the speech mask starts at the vowel (0.6 s), the /s/ before it is hiss; a short closure
    (/p/) may part them."""
    for gap in range(HISS_GAP_FRAMES + 1):
        words = [Word(0.0, 0.2, " the", 1.0, [1]), Word(0.6, 0.9, " speech", 1.0, [2])]
        extend_starts_through_hiss(words, _hiss((20 - gap, 30 - gap)), 0.0, "en")
        assert words[1].start == round(0.4 - gap * 0.02, 2), gap
    words = [Word(0.0, 0.2, " the", 1.0, [1]), Word(0.6, 0.9, " speech", 1.0, [2])]
    extend_starts_through_hiss(words, _hiss((20, 29 - HISS_GAP_FRAMES)), 0.0, "en")
    assert words[1].start == 0.6  # a longer silence: the hiss is no part of the word


def test_a_start_takes_hiss_only_for_a_word_spelled_with_a_hiss_first():
    """A breath in a pause is hiss too: "open" keeps its start; so does a word of another language."""
    for word, language in ((" open", "en"), (" sopa", "es"), (" so", None)):
        words = [Word(0.6, 0.9, word, 1.0, [1])]
        extend_starts_through_hiss(words, _hiss((20, 30)), 0.0, language)
        assert words[0].start == 0.6, word


def test_hiss_that_runs_back_into_the_previous_word_stays_its_coda():
    """ "was so": hiss back to the previous word's end may be that word's /z/."""
    words = [Word(0.1, 0.4, " was", 1.0, [1]), Word(0.6, 0.9, " so", 1.0, [2])]
    extend_starts_through_hiss(words, _hiss((20, 30)), 0.0, "en")
    assert words[1].start == 0.6
    words = [Word(0.1, 0.3, " was", 1.0, [1]), Word(0.6, 0.9, " so", 1.0, [2])]
    extend_starts_through_hiss(words, _hiss((20, 30)), 0.0, "en")  # a silence after the previous word
    assert words[1].start == 0.4


def test_a_start_runs_back_through_hiss_no_further_than_hiss_max_s():
    words = [Word(1.6, 1.9, " fish", 1.0, [1])]
    extend_starts_through_hiss(words, _hiss((10, 80)), 0.0, "en")
    assert words[0].start == round(1.6 - HISS_MAX_S, 2)


@pytest.mark.parametrize(
    ("word", "hiss"),
    [
        (" so", True),
        (" Fish", True),
        (" think", True),
        (' "she', True),
        (" city", True),
        (" phone", True),
        (" hat", True),
        (" zero", True),
        (" cat", False),
        (" tea", False),
        (" open", False),
        (" we", False),
    ],
)
def test_a_hiss_start_is_read_from_english_spelling(word, hiss):
    assert starts_with_hiss(word, "en") is hiss
    assert not starts_with_hiss(word, "de")


def _onsets_with_peak_at(seconds: float, length: int = 300) -> np.ndarray:
    onsets = np.full(length, 0.1, dtype=np.float32)
    onsets[int(round(seconds / 0.01))] = 5.0
    return onsets


def _rises(onsets: np.ndarray) -> SpectralFlux:
    return SpectralFlux(rises=onsets, falls=np.zeros_like(onsets))


def test_refine_moves_a_start_inside_speech_to_the_nearby_onset():
    speech = np.ones(150, dtype=bool)
    word = Word(1.0, 1.5, " w", 1.0, [1])
    refine_starts([word], _rises(_onsets_with_peak_at(1.04)), speech, 0.0, 0.01)
    assert word.start == 1.03  # the frame the rise comes from: frame k's rise is from frame k - 1
    far = Word(1.0, 1.5, " w", 1.0, [1])
    refine_starts([far], _rises(_onsets_with_peak_at(1.2)), speech, 0.0, 0.01)  # beyond ONSET_SEARCH_S
    assert far.start == 1.0  # nothing stronger in reach: it stays


def test_refine_weighs_onsets_by_their_distance():
    speech = np.ones(150, dtype=bool)
    onsets = _onsets_with_peak_at(1.1)  # a strong onset 100 ms on (5.0)
    onsets[103] = 1.0  # and a weak one next to the start
    strong = Word(1.0, 1.5, " w", 1.0, [1])
    refine_starts([strong], _rises(onsets), speech, 0.0, 0.01)
    assert strong.start == 1.09
    onsets[102], onsets[110], onsets[111] = 3.0, 0.1, 3.5  # strong close, a little stronger far
    near = Word(1.0, 1.5, " w", 1.0, [1])
    refine_starts([near], _rises(onsets), speech, 0.0, 0.01)
    assert near.start == 1.01


@pytest.mark.parametrize(
    "word, quiet",
    [
        (" to", True),
        (" Many", True),
        (" with", True),
        (' "Come', True),
        (" chair", True),
        (" a", False),
        (" so", False),
        (" listened", False),
        (" the", True),
        (" über", False),
        (" 東京", False),
    ],
)
def test_a_start_is_quiet_by_its_first_letter(word, quiet):
    assert starts_quietly(word, "en") is quiet


def test_the_first_letter_is_read_as_english_spelling_only():
    """German "w" is /v/, Spanish "c" before "e" is /s/: other languages keep the rise alone."""
    assert starts_quietly(" wasser", "en") and not starts_quietly(" wasser", "de")
    assert not starts_quietly(" cena", "es") and not starts_quietly(" to", None)


def test_a_quiet_start_takes_the_fall_and_a_loud_one_the_rise():
    """A stop's closure starts where the sound before it falls; a vowel or /s/ where new sound rises."""
    speech = np.ones(150, dtype=bool)
    rises, falls = np.full(300, 0.1, dtype=np.float32), np.zeros(300, dtype=np.float32)
    rises[106] = 2.0  # a rise 60 ms after the start (a burst)
    falls[96] = 2.0  # a fall as strong, 40 ms before it (the sound before the closure ends)
    flux = SpectralFlux(rises, falls)
    stop = Word(1.0, 1.5, " to", 1.0, [1])
    refine_starts([stop], flux, speech, 0.0, 0.01)
    assert stop.start == 0.95
    vowel = Word(1.0, 1.5, " a", 1.0, [1])
    refine_starts([vowel], flux, speech, 0.0, 0.01)
    assert vowel.start == 1.05
    german = Word(1.0, 1.5, " to", 1.0, [1])  # the same spelling in a German text: the rise
    refine_starts([german], flux, speech, 0.0, 0.01, language="de")
    assert german.start == 1.05


def test_refine_leaves_starts_after_silence_and_never_crosses_the_previous_word():
    speech = np.array([0] * 50 + [1] * 100, dtype=bool)
    after_silence = Word(1.0, 1.5, " a", 1.0, [1])
    refine_starts([after_silence], _rises(_onsets_with_peak_at(1.05)), speech, 0.0, 0.01)
    assert after_silence.start == 1.0
    speech = np.ones(150, dtype=bool)
    first, second = Word(0.5, 1.0, " a", 1.0, [1]), Word(1.02, 1.5, " b", 1.0, [2])
    refine_starts([first, second], _rises(_onsets_with_peak_at(0.97)), speech, 0.0, 0.01)
    assert second.start >= 1.0


def test_refine_respects_the_offset():
    speech = np.ones(150, dtype=bool)
    word = Word(31.0, 31.5, " w", 1.0, [1])
    refine_starts([word], _rises(_onsets_with_peak_at(0.97)), speech, 30.0, 0.01)
    assert word.start == 30.96


def test_extend_ends_runs_an_end_inside_sound_on_to_the_pause():
    # word 0.0-0.6 of sound, pause 0.6-0.9, next word from 0.9
    speech = np.array([1] * 30 + [0] * 15 + [1] * 20, dtype=bool)
    early = Word(0.0, 0.4, " a", 1.0, [1])
    following = Word(0.9, 1.3, " b", 1.0, [2])
    extend_ends([early, following], speech, 0.0)
    assert early.end == 0.6 and following.end == 1.3  # the last word runs to its sound's end


def test_extend_ends_runs_on_through_a_quiet_tail_that_stops_before_the_next_word():
    # word 0.0-0.6 loud, its quiet tail 0.6-0.68, silence, next word from 0.9
    speech = np.array([1] * 30 + [0] * 15 + [1] * 20, dtype=bool)
    sound = np.array([1] * 34 + [0] * 11 + [1] * 20, dtype=bool)
    word, following = Word(0.0, 0.4, " a", 1.0, [1]), Word(0.9, 1.3, " b", 1.0, [2])
    extend_ends([word, following], speech, 0.0, sound=sound)
    assert word.end == 0.68
    for tail in (15, 12):  # sound up to the next word, or on for longer than TAIL_MAX_S: no tail to end
        sound = np.array([1] * (30 + tail) + [0] * (15 - tail) + [1] * 20, dtype=bool)
        word, following = Word(0.0, 0.4, " a", 1.0, [1]), Word(0.9, 1.3, " b", 1.0, [2])
        extend_ends([word, following], speech, 0.0, sound=sound)
        assert word.end == 0.6, tail


def test_extend_ends_keeps_ends_in_continuous_speech_and_after_sound():
    speech = np.ones(60, dtype=bool)
    word, following = Word(0.0, 0.4, " a", 1.0, [1]), Word(0.4, 0.8, " b", 1.0, [2])
    extend_ends([word, following], speech, 0.0)
    assert word.end == 0.4  # no pause before the next word: nothing to extend to
    speech = np.array([1] * 10 + [0] * 50, dtype=bool)
    quiet_end = Word(0.0, 0.5, " a", 1.0, [1])
    extend_ends([quiet_end], speech, 0.0)
    assert quiet_end.end == 0.5  # ends in silence already


def test_join_ends_runs_a_word_on_to_the_next_through_sound_only():
    # sound 0.0-0.8 with no pause, a pause 0.8-1.0, sound from 1.0
    speech = np.array([1] * 40 + [0] * 10 + [1] * 20, dtype=bool)
    words = [
        Word(0.0, 0.3, " a", 1.0, [1]),  # ends early, the next starts at 0.36 through sound: joined
        Word(0.36, 0.7, " b", 1.0, [2]),  # ends at 0.7, a pause before the next: kept
        Word(1.0, 1.3, " c", 1.0, [3]),
    ]
    join_ends(words, speech, 0.0)
    assert [(w.start, w.end) for w in words] == [(0.0, 0.36), (0.36, 0.7), (1.0, 1.3)]


def test_join_ends_respects_the_offset_and_overlaps():
    speech = np.ones(30, dtype=bool)
    words = [Word(30.0, 30.3, " a", 1.0, [1]), Word(30.2, 30.5, " b", 1.0, [2])]
    join_ends(words, speech, 30.0)
    assert words[0].end == 30.2  # an end past the next start is cut back to it


def test_extend_starts_runs_a_start_after_a_pause_back_through_its_quiet_head():
    # the word before ends at 0.4; silence to 0.8; a quiet head 0.8-0.86; the voice from 0.86
    speech = np.array([1] * 20 + [0] * 23 + [1] * 20, dtype=bool)
    sound = np.array([1] * 20 + [0] * 20 + [1] * 23, dtype=bool)
    before, word = Word(0.0, 0.4, " a", 1.0, [1]), Word(0.86, 1.2, " he", 1.0, [2])
    extend_starts([before, word], speech, 0.0, sound)
    assert (before.start, word.start) == (0.0, 0.8)


def test_extend_starts_leaves_sound_that_goes_on_further_than_a_head():
    speech = np.array([0] * 20 + [1] * 20, dtype=bool)
    hum = np.ones(40, dtype=bool)  # room tone over the noise floor all the way back: no head begins
    word = Word(0.4, 0.8, " he", 1.0, [1])
    extend_starts([word], speech, 0.0, hum)
    assert word.start == 0.4
    inside = Word(0.5, 0.8, " he", 1.0, [1])  # a start inside speech is refine_starts' to move
    extend_starts([inside], speech, 0.0, np.array([0] * 17 + [1] * 23, dtype=bool))
    assert inside.start == 0.5
    first = Word(30.04, 30.4, " he", 1.0, [1])  # a head from the input's first frame, at an offset
    extend_starts([first], np.array([0, 0] + [1] * 18, dtype=bool), 30.0, np.ones(20, dtype=bool))
    assert first.start == 30.0
