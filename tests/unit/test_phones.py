"""audio.phones: Whisper's words spelled in the dictionary's words, and placed by PocketSphinx on speech
whose word starts are known (espeak-ng, continuous)."""

import os
import time
from dataclasses import dataclass

import numpy as np
import psutil
import pytest

from tests.support import real_speech
from tests.support.no_speech import with_noise
from tests.support.rooms import in_room
from tests.support.speech import synthesize_sentence, synthesize_words
from vllm_whisper_align.audio import phones
from vllm_whisper_align.audio.dereverb import Mode
from vllm_whisper_align.constants import SAMPLE_RATE


@dataclass
class Timed:
    start: float
    end: float
    word: str


@pytest.fixture(scope="module")
def dictionary():
    return phones.decoder()  # this process's: spell() runs in the worker process


@pytest.mark.parametrize(
    "word, spelled",
    [
        (" Hello,", ["hello"]),
        (" Mr.", ["mr."]),
        (" don’t", ["don't"]),
        (" 12", ["twelve"]),
        (" 1,500", ["one", "thousand", "five", "hundred"]),
        (" 1990", ["nineteen", "ninety"]),
        (" 2005", ["two", "thousand", "five"]),
        (" 3.5", ["three", "point", "five"]),
        (" cold-hearted", ["cold", "hearted"]),
        ("-hearted", ["hearted"]),
        (" ...", []),
    ],
)
def test_words_are_spelled_in_the_dictionarys_words(dictionary, word, spelled):
    assert [text for text, _ in phones.spell(word, dictionary)] == spelled


def test_a_word_the_dictionary_lacks_is_read_from_its_letters(dictionary):
    [(text, reading)] = phones.spell(" Fredthamlet.", dictionary)
    assert text == "fredthamlet"
    assert reading == "F R EH D TH AE M L EH T"


@pytest.mark.parametrize("word", [" $5", " 10,000,000", " ∆", " 3rd"])
def test_what_cannot_be_read_is_none(dictionary, word):
    assert phones.spell(word, dictionary) is None


@pytest.fixture(scope="module")
def sentence():
    return synthesize_sentence("the quick brown fox jumps over the lazy dog near the river bank")


def shifted(clip, by: float) -> list[Timed]:
    """The clip's words with starts ``by`` seconds off the truth, each ending where the next starts."""
    starts = [s + by for s in clip.starts]
    ends = [*starts[1:], clip.ends[-1] + by]
    return [Timed(s, e, w) for s, e, w in zip(starts, ends, clip.words, strict=True)]


def test_words_moved_onto_their_sound(sentence):
    words = shifted(sentence, 0.08)
    truth = np.array(sentence.starts)
    known = np.isfinite(truth)
    before = np.abs(np.array([w.start for w in words]) - truth)[known]
    assert phones.place_words(words, sentence.samples, 0.0, "en") == len(words)
    after = np.abs(np.array([w.start for w in words]) - truth)[known]
    assert np.mean(before <= 0.05) == 0.0
    assert np.mean(after <= 0.05) >= 0.8
    assert all(a.end <= b.start + 1e-9 for a, b in zip(words, words[1:], strict=False))


def test_a_clip_cut_close_around_its_words_keeps_them_off_its_edges(sentence):
    """A clip cut 50 ms before its first word and 30 ms after its last (as a voice activity detector cuts
    a command). Given it bare, PocketSphinx began the first word on the clip's first frame (0.05 s
    early) and ran the last to the clip's end (0.02 s late); with silence laid around it, neither."""
    first = round((sentence.starts[0] - 0.05) * SAMPLE_RATE)
    stop = round((sentence.ends[-1] + 0.03) * SAMPLE_RATE)
    pcm = (np.clip(sentence.samples[first:stop], -1.0, 1.0) * 32767).astype(np.int16).tobytes()
    spans = phones.align_utterance(pcm, sentence.words)
    assert spans is not None
    assert 0.0 < spans[0][0] and abs(spans[0][0] - 0.05) <= 0.04
    assert abs(spans[-1][1] - (sentence.ends[-1] - first / SAMPLE_RATE)) <= 0.015


def test_words_spoken_to_the_audios_end_stay_within_it_to_the_10_ms(sentence):
    """Audio cut inside its last word 7 ms past a 10 ms frame: the last word ends at the audio's last
    whole frame, so that its time rounded to 10 ms (as the answer gives it) is not after the audio's
    end (a packed input's word ended at 1.28 s of 1.2759)."""
    frame = SAMPLE_RATE // 100
    stop = int((sentence.starts[-1] + 0.15) * 100) * frame + 7 * frame // 10
    pcm = (np.clip(sentence.samples[:stop], -1.0, 1.0) * 32767).astype(np.int16).tobytes()
    spans = phones.align_utterance(pcm, sentence.words)
    assert spans is not None
    duration = stop / SAMPLE_RATE
    assert spans[-1][1] == pytest.approx(round(duration - 0.005, 2))
    assert all(round(end, 2) <= duration for _, end in spans)


def test_times_are_absolute_when_the_window_starts_later(sentence):
    offset = 30.0
    words = shifted(sentence, offset + 0.08)
    phones.place_words(words, sentence.samples, offset, "en")
    alone = shifted(sentence, 0.08)
    phones.place_words(alone, sentence.samples, 0.0, "en")
    assert [round(w.start - offset, 3) for w in words] == [round(w.start, 3) for w in alone]


def test_other_languages_keep_their_times(sentence):
    words = shifted(sentence, 0.08)
    kept = [(w.start, w.end) for w in words]
    assert phones.place_words(words, sentence.samples, 0.0, "de") == 0
    assert [(w.start, w.end) for w in words] == kept


def test_a_word_that_cannot_be_read_keeps_its_time_and_the_rest_are_placed(sentence):
    """A window without a path is cut in two at its widest pause, and each half tried on its own."""
    words = shifted(sentence, 0.08)
    words[3].word = " $5"
    kept = (words[3].start, words[3].end)
    before = [(w.start, w.end) for w in words]
    placed = phones.place_words(words, sentence.samples, 0.0, "en")
    assert (words[3].start, words[3].end) == kept
    assert len(words) // 2 <= placed < len(words)
    moved = np.array([(w.start, w.end) != b for w, b in zip(words, before, strict=True)])
    errors = np.abs(np.array([w.start for w in words]) - np.array(sentence.starts))
    known = np.isfinite(errors)
    assert np.mean(errors[moved & known] <= 0.05) >= 0.8


def test_answers_do_not_depend_on_the_windows_before(sentence):
    """The same window placed after two others that end differently: the same answer (PocketSphinx's
    features carried the last utterance's state: a boundary moved by 10 ms)."""
    clip = synthesize_words(["the", "morning", "train", "was", "late", "again"], gap_s=0.3)
    answers = []
    for before in (sentence, synthesize_sentence("she sells sea shells by the sea shore")):
        phones.place_words(shifted(before, 0.05), before.samples, 0.0, "en")
        words = shifted(clip, 0.0)
        phones.place_words(words, clip.samples, 0.0, "en")
        answers.append([(w.start, w.end) for w in words])
    assert answers[0] == answers[1]


def test_answers_do_not_depend_on_the_utterances_before():
    """The same window aligned after each of a few others, in this process's decoder: the same answer
    every time. With Gaussians scored every other frame, which it scores carried over from the last
    utterance: "kitchen" came back at 2.23 s after some windows and 2.29 s after others (a server test
    saw it: 32 requests at once against each alone), until every utterance began and ended with the
    same samples of silence."""
    from tests.support.servers import distinct_clips

    clips = distinct_clips(14)
    pcm = [(np.clip(c.samples, -1.0, 1.0) * 32767).astype(np.int16).tobytes() for c in clips]
    text = " Please open her kitchen window.".split()  # what tiny.en heard in clip 13
    answers = set()
    for before in (0, 3, 9, 10):
        phones.align_utterance(pcm[before], clips[before].words)
        answers.add(tuple(phones.align_utterance(pcm[13], text)))
    assert len(answers) == 1, answers


def test_a_window_without_a_path_within_the_beam_is_searched_without_one(sentence, monkeypatch):
    """A beam this narrow leaves no path through the sentence (as BEAM leaves none through 25 s of
    speech with white noise 20 dB under it): the search without a beam places the words where BEAM's
    does."""
    pcm = (np.clip(sentence.samples, -1.0, 1.0) * 32767).astype(np.int16).tobytes()
    placed = phones.align_utterance(pcm, sentence.words)  # this process's decoder
    assert phones.search(phones.decoder(), pcm, sentence.words, 1e-2) is None
    monkeypatch.setattr(phones, "BEAM", 1e-2)
    assert phones.align_utterance(pcm, sentence.words) == placed


def test_answers_do_not_depend_on_the_times_given(sentence):
    """The heads' times move by a frame with the engine's batch; the placed words must not."""
    early, late = shifted(sentence, 0.03), shifted(sentence, 0.15)
    for words in (early, late):
        phones.place_words(words, sentence.samples, 0.0, "en")
    assert [(w.start, w.end) for w in early] == [(w.start, w.end) for w in late]


def test_windows_aligned_at_once_get_the_answers_they_get_alone(sentence):
    """Two windows at the same time go to two worker processes (a second one starts for it)."""
    from concurrent.futures import ThreadPoolExecutor

    alone = shifted(sentence, 0.05)
    phones.place_words(alone, sentence.samples, 0.0, "en")
    together = [shifted(sentence, 0.05) for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda words: phones.place_words(words, sentence.samples, 0.0, "en"), together))
    for words in together:
        assert [(w.start, w.end) for w in words] == [(w.start, w.end) for w in alone]


def test_audio_too_short_for_a_word_keeps_its_times_and_the_worker_goes_on(sentence):
    words = [Timed(0.0, 0.02, " hello"), Timed(0.02, 0.04, " world")]
    assert phones.place_words(words, np.zeros(SAMPLE_RATE // 20, dtype=np.float32), 0.0, "en") == 0
    assert [(w.start, w.end) for w in words] == [(0.0, 0.02), (0.02, 0.04)]
    after = shifted(sentence, 0.05)
    assert phones.place_words(after, sentence.samples, 0.0, "en") == len(after)


def test_a_worker_runs_at_a_lower_cpu_priority_than_its_parent_on_one_thread(sentence):
    """One thread: OpenBLAS's own (one a core, started as NumPy loads) spun for one another while the
    engine held the cores, and a window's reverberation took 18 s instead of 0.3 s."""
    worker = phones.Worker()
    try:
        assert worker.align([((sentence.samples * 32767).astype(np.int16).tobytes(), [" hello"], True)])
        process = psutil.Process(worker._process.pid)
        assert process.nice() == os.nice(0) + phones.NICENESS
        assert process.num_threads() == 1
    finally:
        worker.close()


def test_a_started_worker_loads_the_model_before_the_first_call():
    """phones.start(), as an engine starts: the first window's words waited for a cold worker (Python,
    PocketSphinx and its model, at a lower priority) where the engine held the cores."""
    workers = phones.Workers(2)
    try:
        workers.start()
        started = [worker for worker in workers._idle if worker._process is not None]
        assert started == [workers._idle[-1]]  # the one the first call takes
        process = psutil.Process(started[0]._process.pid)
        deadline = time.monotonic() + 60
        while not any("pocketsphinx" in mapped.path for mapped in process.memory_maps()):
            assert time.monotonic() < deadline, "the worker never loaded PocketSphinx"
            time.sleep(0.1)
    finally:
        for worker in workers._idle:
            worker.close()


def test_a_text_that_writes_a_filled_pause_is_searched_without_filled_pause_fillers(dictionary):
    assert phones.writes_filled_pauses([" So", " um,", " yes."])
    assert phones.writes_filled_pauses([" Uh"])
    assert not phones.writes_filled_pauses([" umbrella", " huh"])
    assert dictionary.lookup_word("++UM++") == "AH M"
    assert phones.decoder(filled_pauses=False).lookup_word("++UM++") is None


@pytest.fixture(scope="module")
def cold_talker():
    """MFA's recording of a talker with a cold, speaking freely: "... a bunch of different words. um I
    think I'm probably gonna cough here. uh yeah so that just happened ..." (MFA's own alignment)."""
    [clip] = [
        c for c in real_speech.load_clips(log=lambda *_: None, sets=("spontaneous",)) if c.id.endswith("3")
    ]
    return clip


def test_words_after_a_filled_pause_the_text_leaves_out_keep_their_own_sound(cold_talker):
    """Whisper writes no "um" or "uh". Given the text without them (each word 80 ms late), the words after
    them start where they are spoken but one ("that" after a second "uh", 0.29 s early); with [SPEECH]
    as the only filler, 2 of 6 did ("and" 0.42 s early, on its "uh"; two words kept the times they came
    with, the model's further from them than MAX_MOVE_S)."""
    clip = cold_talker
    kept = [i for i, filled in enumerate(clip.filled) if not filled]
    words = [Timed(clip.starts[i] + 0.08, clip.ends[i] + 0.08, " " + clip.words[i]) for i in kept]
    phones.place_words(words, clip.samples, 0.0, "en")
    after_filler = [k for k, i in enumerate(kept) if i > 0 and clip.filled[i - 1]]
    errors = [abs(words[k].start - clip.starts[kept[k]]) for k in after_filler]
    assert len(errors) == 6
    assert sum(error <= 0.05 for error in errors) >= 5


def test_filled_pauses_the_text_writes_keep_their_own_sound(cold_talker):
    """A verbatim text writes its "uh"s and "um"s: it is searched without filled-pause fillers, and 5 of
    its 6 start within 50 ms of where they are spoken; with them, 3 (a filler took the written word's
    sound, and the word started up to 0.3 s late)."""
    clip = cold_talker
    words = [
        Timed(s + 0.08, e + 0.08, " " + w) for w, s, e in zip(clip.words, clip.starts, clip.ends, strict=True)
    ]
    phones.place_words(words, clip.samples, 0.0, "en")
    errors = [
        abs(word.start - start)
        for word, start, filled in zip(words, clip.starts, clip.filled, strict=True)
        if filled
    ]
    assert len(errors) == 6
    assert sum(error <= 0.05 for error in errors) >= 5


@pytest.fixture(scope="module")
def first_cold_recording():
    """MFA's first recording of the talker with a cold (26 s, 64 words)."""
    clips = real_speech.load_clips(log=lambda *_: None, sets=("spontaneous",))
    [clip] = [c for c in clips if c.id == "mfa_cold_corpus"]
    return clip


def within_50ms(clip, samples: np.ndarray, dereverberate: Mode, denoise: bool) -> tuple[int, int]:
    """How many of ``clip``'s words start, and end, within 50 ms of the truth, ``samples`` (its audio in
    some condition) forced to its text with these settings."""
    pcm = phones.pcm16(samples).tobytes()
    times = phones.align_utterance(pcm, [" " + word for word in clip.words], dereverberate, denoise)
    assert times is not None and all(span is not None for span in times)
    starts = sum(abs(span[0] - start) <= 0.05 for span, start in zip(times, clip.starts, strict=True))
    ends = sum(abs(span[1] - end) <= 0.05 for span, end in zip(times, clip.ends, strict=True))
    return starts, ends


def test_words_in_a_reverberant_room_are_placed_on_their_own_sound(first_cold_recording):
    """The recording played in a simulated room whose tail falls by 60 dB in 1 s, forced to its text:
    with the room's late reverberation taken out first (``whisper_align.dereverberate``), 54 starts and
    41 ends within 50 ms of the truth; without, 46 and 34 (a word's end ran on through the room's tail,
    and the next word's onset was smeared). The noise filter does not run where the tail was taken out."""
    clip = first_cold_recording
    room = in_room(clip.samples, 1.0, seed=0)
    starts, ends = within_50ms(clip, room, dereverberate=True, denoise=True)
    starts_reverberant, ends_reverberant = within_50ms(clip, room, dereverberate=False, denoise=False)
    assert starts >= 51 and ends >= 38
    assert starts >= starts_reverberant + 4 and ends >= ends_reverberant + 4
    # The default's gate finds the tail.
    assert within_50ms(clip, room, dereverberate="auto", denoise=True) == (starts, ends)


def test_words_over_a_noise_floor_are_placed_on_their_own_sound(first_cold_recording):
    """The recording with pink noise 10 dB under its speech, forced to its text: with the noise floor
    taken out first (``whisper_align.denoise``), 23 starts and 28 ends within 50 ms of the truth;
    without, 4 and 5 (the noise took the words' quiet edges, and the search lost its way)."""
    clip = first_cold_recording
    noisy = with_noise(clip.samples, "pink", 10, seed=0)
    starts, ends = within_50ms(clip, noisy, dereverberate="auto", denoise=True)
    starts_noisy, ends_noisy = within_50ms(clip, noisy, dereverberate="auto", denoise=False)
    assert starts >= 20 and ends >= 24
    assert starts >= starts_noisy + 12 and ends >= ends_noisy + 12


def test_the_process_settings_reach_the_workers(monkeypatch):
    sent = []
    monkeypatch.setattr(phones._workers, "align", lambda utterances: sent.extend(utterances) or [None])
    monkeypatch.setattr(phones._workers, "dereverberate", phones._workers.dereverberate)  # put back after
    monkeypatch.setattr(phones._workers, "denoise", phones._workers.denoise)
    words = [Timed(0.0, 0.5, " hello")]
    for dereverberate, denoise in ((True, False), (False, True), ("auto", True)):
        phones.configure(dereverberate=dereverberate, denoise=denoise)
        phones.place_words(words, np.zeros(SAMPLE_RATE, dtype=np.float32), 0.0, "en")
    assert [utterance[2:] for utterance in sent] == [(True, False), (False, True), ("auto", True)]


def test_an_urgent_call_takes_the_next_free_worker_before_calls_that_waited_longer():
    """Calls wait for a phone worker in order of arrival, urgent ones (``URGENT`` set: a short
    request's or a live round's windows) first: where the workers cannot keep up with the engine, a
    live round waited behind every window of the files before it."""
    import contextvars
    import threading
    import time

    from vllm_whisper_align.audio.phones import URGENT, Workers

    order: list[str] = []
    release = {name: threading.Event() for name in ("held", "early", "second", "urgent")}

    class Held:
        """Stands in for the worker process: records who has it, and holds it until released."""

        def align(self, utterances):
            [name] = utterances
            order.append(name)
            assert release[name].wait(10), name
            return [None]

    workers = Workers(0)
    workers._idle.append(Held())

    def call(name: str, urgent: bool) -> threading.Thread:
        context = contextvars.copy_context()
        context.run(URGENT.set, urgent)
        thread = threading.Thread(target=context.run, args=(workers.align, [name]))
        thread.start()
        time.sleep(0.2)  # in line before the next call
        return thread

    threads = [call("held", False), call("early", False), call("second", False), call("urgent", True)]
    for name in ("held", "urgent", "early", "second"):
        release[name].set()
        time.sleep(0.2)
    for thread in threads:
        thread.join(10)
    assert order == ["held", "urgent", "early", "second"]
