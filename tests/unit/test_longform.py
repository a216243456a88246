"""Splitting a long transcript over windows and joining the windows back, without an engine."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.tokens import whisper_tokens
from vllm_whisper_align.align.results import TokenTiming, Transcript
from vllm_whisper_align.align.words import Word, normalise
from vllm_whisper_align.audio.windows import AudioChunk, audible_windows
from vllm_whisper_align.errors import AlignmentInputError
from vllm_whisper_align.longform import steps as longform_steps
from vllm_whisper_align.longform.check import MAX_WORD_SECONDS, realign_regions, unheard_windows
from vllm_whisper_align.longform.join import Reading, finish
from vllm_whisper_align.longform.matching import SKIP_MIN_WORDS
from vllm_whisper_align.longform.prefixes import place_prefixes
from vllm_whisper_align.longform.split import (
    ZONE_MARGIN_WORDS,
    ZONE_MAX_WORDS,
    Split,
    choose_cuts,
    owners,
    prefix_split,
    split_text,
)
from vllm_whisper_align.longform.steps import (
    Hear,
    advance,
    alignment_steps,
    force_jobs,
    in_window_order,
    second_pass_order,
    split_and_force,
)
from vllm_whisper_align.longform.words import TextWord, text_words

SAMPLE_RATE = 16000


def words_of(text: str, tokens_per_word: int = 1) -> list[TextWord]:
    """Synthetic given words, each of ``tokens_per_word`` made-up token ids."""
    return [
        TextWord(" " + word, list(range(i * tokens_per_word, (i + 1) * tokens_per_word)), normalise(word))
        for i, word in enumerate(text.split())
    ]


def heard_of(*windows: str) -> list[list[str]]:
    return [[normalise(w) for w in window.split()] for window in windows]


def numbered(prefix: str, count: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(count))


def owners_by_estimate(split: Split) -> np.ndarray:
    return owners(split, split.estimates)


def test_words_match_their_heard_windows():
    text = f"{numbered('a', 20)} {numbered('b', 20)} {numbered('c', 20)}"
    heard = heard_of(numbered("a", 20), numbered("b", 20), numbered("c", 20))
    split = split_text(words_of(text), heard)
    assert split.aligned.all()
    np.testing.assert_array_equal(owners_by_estimate(split), np.repeat([0, 1, 2], 20))
    # Every word is forced in the window that holds it.
    for window in range(3):
        assert set(range(20 * window, 20 * window + 20)) <= set(split.share(window))


def test_repeated_text_keeps_each_repetition_in_its_window():
    """The same sentences over and over (as tests/speech.py's long clips), heard with a few errors: a
    greedy longest-block matcher pairs a repetition with the next one and shifts everything after it."""
    sentences = [
        "the cat sat on the warm mat",
        "please bring me a glass of cold water",
        "we walked to the park after lunch",
        "the train leaves at seven in the morning",
    ]
    text = " ".join(sentences * 6).split()
    rng = np.random.default_rng(3)
    per_window = 40
    heard = []
    for start in range(0, len(text), per_window):
        window = [w for w in text[start : start + per_window] if rng.random() > 0.15]  # 15% not heard
        heard.append([normalise(w if rng.random() > 0.1 else "uh") for w in window])
    split = split_text(words_of(" ".join(text)), heard)
    assert split.aligned.all()
    owner = owners_by_estimate(split)
    assert (owner == np.arange(len(text)) // per_window).mean() > 0.97


def test_case_and_punctuation_do_not_matter():
    given = words_of("Hello, World! THE end.")
    split = split_text(given, heard_of("hello world", "the end"))
    np.testing.assert_array_equal(owners_by_estimate(split), [0, 0, 1, 1])


def test_misheard_words_follow_their_neighbours_by_proportion():
    """Substitutions on both sides of a boundary: the counts of heard words on each side place the cut."""
    given = numbered("a", 30) + " " + numbered("b", 30)
    heard_a = numbered("a", 26) + " x1 x2 x3 x4"  # the last four words of window 0 misheard
    heard_b = "y1 y2 y3 " + " ".join(f"b{i}" for i in range(3, 30))  # the first three of window 1
    split = split_text(words_of(given), heard_of(heard_a, heard_b))
    assert split.aligned.all()
    np.testing.assert_array_equal(owners_by_estimate(split), np.repeat([0, 1], 30))
    lo, hi = split.zones[0]
    assert lo <= 30 <= hi and hi - lo <= 2 * (ZONE_MARGIN_WORDS + 1), split.zones


def test_skipped_paragraph_is_aligned_nowhere():
    spoken_before, skipped, spoken_after = numbered("a", 25), numbered("s", 30), numbered("b", 25)
    given = words_of(f"{spoken_before} {skipped} {spoken_after}")
    heard = heard_of(
        numbered("a", 20),
        numbered("a", 25)[len(numbered("a", 20)) :] + " " + numbered("b", 10),
        " ".join(f"b{i}" for i in range(10, 25)),
    )
    split = split_text(given, heard)
    np.testing.assert_array_equal(split.aligned, np.r_[np.ones(25), np.zeros(30), np.ones(25)].astype(bool))
    forced = {int(i) for w in range(3) for i in split.share(w)}
    assert forced.isdisjoint(range(25, 55))
    assert all(i in forced for i in [*range(25), *range(55, 80)])


def test_a_lone_common_word_does_not_split_a_skipped_paragraph():
    given = words_of(f"{numbered('a', 15)} {numbered('s', 10)} the {numbered('s', 10)} {numbered('b', 15)}")
    heard = heard_of(numbered("a", 15) + " the " + numbered("b", 15))
    split = split_text(given, heard + [[]])
    assert not split.aligned[15:36].any() and split.aligned[:15].all() and split.aligned[36:].all()


def test_short_unheard_runs_are_still_forced():
    """A few words the model did not hear are misheard speech, not missing text: they are aligned."""
    given = words_of(f"{numbered('a', 20)} {numbered('m', SKIP_MIN_WORDS - 1)} {numbered('b', 20)}")
    split = split_text(given, heard_of(numbered("a", 20), numbered("b", 20)))
    assert split.aligned.all()


def test_extra_audio_words_take_no_given_words():
    given = words_of(f"{numbered('a', 20)} {numbered('b', 20)}")
    heard = heard_of(numbered("a", 20) + " applause cheering thank you all", numbered("b", 20))
    split = split_text(given, heard)
    assert split.aligned.all()
    np.testing.assert_array_equal(owners_by_estimate(split), np.repeat([0, 1], 20))


def test_a_window_with_nothing_heard():
    """Silence in the middle window: its neighbours keep their words; words at a boundary with no
    heard words around it are forced on both sides."""
    given = words_of(f"{numbered('a', 20)} {numbered('b', 20)}")
    split = split_text(given, heard_of(numbered("a", 20), "", numbered("b", 20)))
    np.testing.assert_array_equal(owners_by_estimate(split), np.repeat([0, 2], 20))
    assert len(split.share(1)) == 0


def test_nothing_heard_at_all():
    given = words_of("one two three")
    split = split_text(given, heard_of("", ""))
    assert split.aligned.all()  # too short to call missing: forced in both windows, cut by likelihood
    assert list(split.share(0)) == list(split.share(1)) == [0, 1, 2]
    silent_long = split_text(words_of(numbered("w", 40)), heard_of("", ""))
    assert not silent_long.aligned.any()


def test_zone_cut_follows_the_likelihoods():
    """Two words the model dropped at a boundary are forced in both windows; the windows' teacher-forced
    log-probabilities decide which side each is on."""
    given = words_of(f"{numbered('a', 10)} x y {numbered('b', 10)}")
    split = split_text(given, heard_of(numbered("a", 10), numbered("b", 10)))
    assert list(split.zones[0]) == [10, 12]
    left = np.zeros(len(split.share(0)))
    right = np.zeros(len(split.share(1)))
    left[-2:] = [-0.5, -9.0]  # "x" fits the end of window 0, "y" does not
    right[:2] = [-8.0, -0.3]
    cuts = choose_cuts(split, [left, right])
    assert list(cuts) == [11]
    left[-2:] = [-9.0, -9.0]
    assert list(choose_cuts(split, [left, right])) == [10]


def test_matching_thirty_thousand_words():
    """A 3-hour transcript against a hypothesis with 20% of words missed or misheard and some extra
    words; no time limit here (benchmarks measure speed), but the split has to stay exact."""
    rng = np.random.default_rng(0)
    vocabulary = np.array([f"w{i}" for i in range(5000)])
    frequency = 1.0 / np.arange(1, 5001)
    text = rng.choice(vocabulary, size=30000, p=frequency / frequency.sum())
    per_window = 100
    heard = []
    for start in range(0, len(text), per_window):
        window = []
        for word in text[start : start + per_window]:
            roll = rng.random()
            if roll < 0.1:
                continue
            window.append("zz" if roll < 0.2 else word)
        heard.append([normalise(w) for w in window])
    split = split_text(words_of(" ".join(text)), heard)
    owner = owners_by_estimate(split)
    truth = np.arange(len(text)) // per_window
    assert split.aligned.mean() > 0.99
    assert (owner == truth).mean() > 0.99
    assert np.all(np.diff(owner[owner >= 0]) >= 0)


# ---------------------------------------------------------------------------- plans and join


@pytest.fixture(scope="module")
def tokens(model_dir):
    return whisper_tokens(model_dir)


def test_text_words_group_like_the_alignment(tokens):
    ids = tokens.encode(' Hello, world! "Quoted" (words) end.')
    words = text_words(ids, tokens, "en")
    assert [w.text for w in words] == [" Hello,", " world!", ' "Quoted"', " (words)", " end."]
    assert [w.key for w in words] == ["hello", "world", "quoted", "words", "end"]
    assert [t for w in words for t in w.tokens] == ids


def given_of(tokens, text: str) -> list[TextWord]:
    return text_words(tokens.encode(" " + text), tokens, "en")


def finished(split, jobs, transcripts, tokens, duration: float = 70.0) -> dict:
    return finish(split.words, Reading.read(split, jobs, transcripts), tokens, duration, "en").to_dict()


def heard_windows(seconds: float) -> list[AudioChunk]:
    samples = np.random.default_rng(0).standard_normal(int(seconds * SAMPLE_RATE)).astype(np.float32) * 0.01
    return audible_windows(samples)


def heard(*texts: str) -> list[Transcript]:
    """What the model heard in each window, as the first pass's transcripts."""
    return [Transcript("transcribe", "en", 30.0, text, []) for text in texts]


def test_what_is_heard_is_read_greedily_without_retries(tokens):
    """Pass 1 only locates the text: a window failing openai-whisper's thresholds is not sampled again
    (each retry would cost another encoder pass)."""
    from vllm_whisper_align.runners.decoding import WindowOutput, fall_back, plan_hearing

    for window in heard_windows(70):
        plan = plan_hearing(window, tokens, "en", [])
        improbable = [WindowOutput([1], [-3.0], avg_logprob=-3.0, compression_ratio=3.0)]
        assert fall_back(plan, improbable, [0]) == ([], [])
        assert plan.windows[0].temperature == 0.0


def test_a_share_over_the_context_is_refused_with_its_window(tokens):
    windows = heard_windows(70)
    assert len(windows) == 3
    middle = "second part " * 250  # as many words heard as given: not text missing from the audio
    text = f"first part {middle} third part"
    start, end = windows[1].offset, windows[1].offset + windows[1].duration
    with pytest.raises(AlignmentInputError, match=rf"falls in {start:.1f}-{end:.1f} s is 50\d tokens.*448"):
        split_and_force(
            windows, heard("first part", middle, "third part"), tokens, given_of(tokens, text), "en"
        )


def fake_transcript(split, window: int, job, first_start: float, spacing: float, probability: float = 0.9):
    """What the driver returns for a window's forced share: words one after another from first_start."""
    words, token_list, time = [], [], job.audio.offset + first_start
    for index, word_tokens in split.items(window, split.fillers.get(window, ())):
        text = split.words[index].text if index >= 0 else " filler"
        end = time + spacing / 2
        words.append(Word(time, end, text, probability))
        token_list += [TokenTiming(token, "", time, end, probability) for token in word_tokens]
        time += spacing
    return Transcript("align", "en", 30.0, "", [], words, token_list)


def test_finish_returns_every_word_in_order(tokens):
    windows = heard_windows(70)
    spoken = ["first part of the talk", "second part of the talk", "third part of the talk"]
    skipped = " ".join(["never said"] * 8)
    text = f"{spoken[0]}. {skipped}. {spoken[1]}. {spoken[2]}."
    split, jobs = split_and_force(windows, heard(*spoken), tokens, given_of(tokens, text), "en")
    assert all(job.audio.offset == window.offset for job, window in zip(jobs, windows, strict=True))
    results = [fake_transcript(split, w, job, 1.0, 0.5) for w, job in enumerate(jobs)]
    body = finished(split, jobs, results, tokens)
    words = body["words"]
    assert "".join(w["word"] for w in words).strip() == text == body["text"]
    flags = [w["aligned"] for w in words]
    assert flags == [True] * 5 + [False] * 16 + [True] * 10
    starts = np.array([w["start"] for w in words])
    assert np.all(np.diff(starts) >= 0)
    assert starts[0] == pytest.approx(1.0) and starts[5] == pytest.approx(words[4]["end"])
    assert all(w["probability"] == 0 and w["start"] == w["end"] for w in words if not w["aligned"])
    # Absolute times: each window's first word 1 s after its offset.
    assert starts[21] == pytest.approx(windows[1].offset + 1.0)
    assert starts[26] == pytest.approx(windows[2].offset + 1.0) and starts[26] > 40
    assert len(body["tokens"]) == len(tokens.encode(" " + text))
    assert body["segments"] and all(s["start"] <= s["end"] for s in body["segments"])


def test_finish_without_a_window_result(tokens):
    """A window whose alignment failed: its words come back unaligned, the others keep their times."""
    windows = heard_windows(70)
    spoken = ["alpha beta gamma", "delta epsilon zeta", "eta theta iota"]
    split, jobs = split_and_force(windows, heard(*spoken), tokens, given_of(tokens, " ".join(spoken)), "en")
    results = [fake_transcript(split, w, job, 1.0, 0.5) for w, job in enumerate(jobs)]
    results[1] = Transcript("align", "en", 30.0, "", [], [], [], alignment_errors=["no alignment"])
    body = finished(split, jobs, results, tokens)
    assert [w["aligned"] for w in body["words"]] == [True] * 3 + [False] * 3 + [True] * 3
    assert body["alignment_errors"] == ["no alignment"]


def test_heard_words_not_in_the_text_are_found_with_the_word_they_precede():
    """An aside the text does not hold: a run of heard words the edit path pairs with no given word.
    Shorter runs (the model's own "uh") and misheard words (paired by substitution) are not."""
    text = f"{numbered('a', 12)} {numbered('b', 12)}"
    later_b = " ".join(f"b{i}" for i in range(6, 12))
    heard = heard_of(f"{numbered('a', 12)} x0 x1 x2 x3 x4 x5 {numbered('b', 6)}", f"{later_b} uh um")
    split = split_text(words_of(text), heard)
    assert split.aligned.all()
    assert split.extra == [[(12, j) for j in range(12, 18)], []]  # before b0, window 0's heard 12..17
    misheard = heard_of(f"{numbered('a', 12)} y0 y1 y2 y3 {numbered('b', 12)}")
    given = words_of(f"{numbered('a', 12)} z0 z1 z2 z3 {numbered('b', 12)}")
    assert split_text(given, misheard).extra == [[]]
    # A sentence heard as garbage, longer than it is (tiny.en on words with pauses): the text's own
    # words, misheard, not an aside: forced as filler they took its frames (start MAE 136 -> 374 ms).
    garbled = heard_of(f"{numbered('a', 12)} {numbered('g', 12)} {numbered('b', 12)}")
    given = words_of(f"{numbered('a', 12)} {numbered('s', 7)} {numbered('b', 12)}")
    assert split_text(given, garbled).extra == [[]]
    # A sentence heard as a loop (tiny.en's "mad, mad, mad, ..." over words with pauses) is no aside.
    loop = heard_of(f"{numbered('a', 12)} {' '.join(['mad'] * 150)} {numbered('b', 12)}")
    given = words_of(f"{numbered('a', 12)} {numbered('s', 18)} {numbered('b', 12)}")
    assert split_text(given, loop).extra == [[]]


def test_fillers_go_before_the_word_they_precede_and_come_back_nowhere(tokens):
    """The aside's heard words are forced in its window, between the text's words around it; the
    answer holds the given words only, timed after the filler."""
    windows = heard_windows(70)
    spoken = ["one two three four", "five six seven eight", "nine ten eleven twelve"]
    aside = "what a lovely day it is outside"
    transcripts = heard(f"{spoken[0]} {aside} {spoken[1]}", "", spoken[2])
    text = " ".join(spoken)
    split, jobs = split_and_force(windows, transcripts, tokens, given_of(tokens, text), "en")
    items = split.items(0, split.fillers[0])
    kinds = ["given" if index >= 0 else "filler" for index, _ in items]
    assert kinds[:4] == ["given"] * 4 and kinds[4:11] == ["filler"] * 7 and set(kinds[11:]) <= {"given"}
    assert jobs[0].token_ids == [t for _, word_tokens in items for t in word_tokens]
    results = [
        fake_transcript(split, w, job, 1.0, 0.5) if job is not None else None for w, job in enumerate(jobs)
    ]
    body = finished(split, jobs, results, tokens)
    assert "".join(w["word"] for w in body["words"]).strip() == text
    assert all(w["aligned"] for w in body["words"])
    starts = [w["start"] for w in body["words"]]
    assert starts[4] == pytest.approx(windows[0].offset + 1.0 + 11 * 0.5)  # after 4 + 7 words
    assert len(body["tokens"]) == len(tokens.encode(" " + text))


def test_fillers_that_do_not_fit_the_context_are_left_out(tokens):
    windows = heard_windows(70)
    rng = np.random.default_rng(0)  # a long aside of made-up words, far over the context (no loop)
    aside = " ".join(
        "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=rng.integers(3, 8))) for _ in range(200)
    )
    transcripts = heard(f"alpha beta {aside} gamma delta", "epsilon zeta", "eta theta")
    text = "alpha beta gamma delta epsilon zeta eta theta"
    split, _ = split_and_force(windows, transcripts, tokens, given_of(tokens, text), "en")
    assert split.extra[0] and not split.fillers.get(0)
    assert all(index >= 0 for index, _ in split.items(0, split.fillers.get(0, ())))


def test_the_second_pass_runs_last_window_first_and_answers_in_window_order():
    plans = ["p0", None, "p2", "p3"]  # window 1 has no text
    order = second_pass_order(plans)
    assert order == [3, 2, 0]
    bodies = [{"window": k} for k in order]  # answers in the order run
    placed = in_window_order(order, bodies, len(plans))
    assert placed == [{"window": 0}, None, {"window": 2}, {"window": 3}]


# ---------------------------------------------------------------------------- the short first pass


def test_prefixes_place_each_window_where_its_speech_starts():
    text = [normalise(w) for w in f"{numbered('a', 30)} {numbered('b', 30)} {numbered('c', 30)}".split()]
    # Window 1's prefix begins with a misheard word (an edit either way): the speech starts at b0.
    prefixes = [text[:8], ["bee0", *text[31:38]], text[60:68]]
    # The rate expects window 1 two words late: equal costs at b0 and b1, and the speech starts at b0.
    starts, unsure = place_prefixes(text, prefixes, np.array([32.0, 28.0, 30.0]))
    np.testing.assert_array_equal(starts, [0, 30, 60])
    np.testing.assert_array_equal(unsure, [0, 0])  # three of the first four words agree: sure


def test_a_repeated_phrase_is_placed_at_the_repetition_the_rate_expects():
    phrase = "to the park after lunch".split()
    text = [*numbered("a", 25).split(), *phrase, *numbered("b", 25).split(), *phrase]
    text = [normalise(w) for w in [*text, *numbered("c", 30).split()]]
    durations = np.array([30.0, 30.0, 30.0])
    starts, _ = place_prefixes(text, [text[:6], text[55:61], text[85:91]], durations)
    assert starts[1] == 55 and text[55:60] == phrase


def test_a_prefix_that_matches_nowhere_starts_its_window_where_the_rate_expects():
    """Silence, music or speech the text lacks: the window starts where the rate expects it, with the
    widest zone; the second pass's check decides whether that holds."""
    text = [normalise(w) for w in numbered("a", 90).split()]
    durations = np.array([30.0, 30.0, 30.0])
    for heard in (["applause", "music", "cheering", "x"], []):
        starts, unsure = place_prefixes(text, [text[:8], heard, text[60:68]], durations)
        np.testing.assert_array_equal(starts, [0, 30, 60])
        np.testing.assert_array_equal(unsure, [ZONE_MAX_WORDS, 0])


def test_an_unsure_start_shares_words_with_the_window_before():
    words = words_of(numbered("a", 40))
    split = prefix_split(words, np.array([0, 20, 30]), np.array([0, 3]))
    np.testing.assert_array_equal(split.zones, [[20, 20], [27, 33]])
    assert split.aligned.all()
    np.testing.assert_array_equal(split.share(1), np.arange(20, 33))
    np.testing.assert_array_equal(split.share(2), np.arange(27, 40))


def ranked_body(split, window: int, job, ranks: list[int], spacing: float = 0.5) -> Transcript:
    transcript = fake_transcript(split, window, job, 1.0, spacing)
    transcript.token_ranks = ranks
    return transcript


@pytest.fixture
def prefix_case(tokens):
    windows = heard_windows(70)
    spoken = [numbered("alpha", 12), numbered("beta", 12), numbered("gamma", 12)]
    given = text_words(tokens.encode(" " + " ".join(spoken)), tokens, "en")
    placed = place_prefixes(
        [w.key for w in given],
        [[normalise(w) for w in s.split()[:6]] for s in spoken],
        np.array([window.duration for window in windows]),
    )
    split = prefix_split(given, *placed)
    jobs = force_jobs(split, windows, [[], [], []], tokens, "en")
    num_tokens = [len(split.share_tokens(w)) for w in range(3)]
    return split, jobs, num_tokens


def unheard(split, plans, bodies) -> list[int]:
    return list(np.flatnonzero(unheard_windows(Reading.read(split, plans, bodies))))


def test_text_the_model_would_say_is_heard(prefix_case):
    split, plans, num_tokens = prefix_case
    ranks = [[1, 1, 1, 2] * (n // 4) + [1] * (n % 4) for n in num_tokens]  # 75% agreement
    bodies = [ranked_body(split, w, p, r) for w, (p, r) in enumerate(zip(plans, ranks, strict=True))]
    assert unheard(split, plans, bodies) == []


def test_text_the_model_does_not_hear_fails_the_windows_that_keep_it(prefix_case):
    split, plans, num_tokens = prefix_case
    ranks = [[1] * n for n in num_tokens]
    ranks[1][5:13] = [7] * 8  # eight tokens in a row the model would not say: a skipped stretch
    bodies = [ranked_body(split, w, p, r) for w, (p, r) in enumerate(zip(plans, ranks, strict=True))]
    assert unheard(split, plans, bodies) == [1]
    # Seven in twelve leave five the model would say: above MIN_AGREEMENT.
    ranks[1][5] = 1
    bodies = [ranked_body(split, w, p, r) for w, (p, r) in enumerate(zip(plans, ranks, strict=True))]
    assert unheard(split, plans, bodies) == []
    # The same stretch cut by a window boundary is read whole, in text order: both windows fail.
    ranks = [[1] * n for n in num_tokens]
    ranks[0][-4:], ranks[1][:4] = [7] * 4, [7] * 4
    bodies = [ranked_body(split, w, p, r) for w, (p, r) in enumerate(zip(plans, ranks, strict=True))]
    assert unheard(split, plans, bodies) == [0, 1]


def test_a_word_spanning_an_aside_fails_its_window(prefix_case):
    split, plans, num_tokens = prefix_case
    bodies = [
        ranked_body(split, w, p, [1] * n) for w, (p, n) in enumerate(zip(plans, num_tokens, strict=True))
    ]
    assert unheard(split, plans, bodies) == []
    bodies[2].words[3].end = bodies[2].words[3].start + MAX_WORD_SECONDS + 0.5
    assert unheard(split, plans, bodies) == [2]


def test_a_window_without_a_result_fails(prefix_case):
    split, plans, num_tokens = prefix_case
    bodies = [
        ranked_body(split, w, p, [1] * n) for w, (p, n) in enumerate(zip(plans, num_tokens, strict=True))
    ]
    bodies[1] = None
    assert unheard(split, plans, bodies) == [1]


def test_failed_windows_are_aligned_again_with_their_neighbours():
    def regions(*failed: int, num_windows: int = 8) -> list[tuple[int, int]]:
        return realign_regions(np.isin(np.arange(num_windows), failed))

    assert regions() == []
    assert regions(3) == [(2, 5)]
    assert regions(0, 7) == [(0, 2), (6, 8)]
    assert regions(1, 4) == [(0, 6)]  # runs that meet are one
    assert regions(1, 5) == [(0, 3), (4, 7)]
    assert regions(0, num_windows=2) == [(0, 2)]  # fewer windows than a window and its neighbours
    assert regions(0, num_windows=1) == [(0, 1)]


class FakeEngine:
    """Answers alignment_steps' plans as the engine would for speech of ``spoken`` (per window: its
    words): a prefix step hears each window's first words, a full one all of them (both past the
    first ``skipped_start[w]`` words of window w, as tiny.en's transcript skips a window's first
    sentences), and a forced window gets its tokens one after another, 0.3 s apart from 1 s after its
    offset; a token is of rank 1 and its word's probability high where the window holds the word,
    except for ``unheard`` words before the full pass, else of rank 7 and probability 0.01. Records
    the windows each step ran."""

    def __init__(
        self,
        tokens,
        windows: list,
        spoken: list[str],
        unheard: set[str] = frozenset(),
        skipped_start: dict[int, int] | None = None,
    ):
        self.tokens, self.spoken, self.unheard = tokens, spoken, unheard
        self.skipped_start = skipped_start or {}
        self.offsets = [w.offset for w in windows]
        # Per step: its name, the windows transcribed, the windows forced.
        self.steps: list[tuple[str, list[int], list[int]]] = []

    def run(self, name: str, jobs) -> list[Transcript]:
        short = name.startswith(("p", "z"))  # before the full pass
        heard, forced, transcripts = [], [], []
        for job in jobs:
            window = self.offsets.index(job.audio.offset)
            if isinstance(job, Hear):
                heard.append(window)
                words = self.spoken[window].split()[self.skipped_start.get(window, 0) :]
                transcripts.append(
                    Transcript("transcribe", "en", 30.0, " ".join(words[: 6 if short else None]), [])
                )
            else:
                forced.append(window)
                transcripts.append(self.forced(job, window, probability=0.9 if short else 0.8, short=short))
        self.steps.append((name, heard, forced))
        return transcripts

    def forced(self, job, window: int, probability: float, short: bool) -> Transcript:
        held = set(self.spoken[window].split())
        words = text_words(job.token_ids, self.tokens, "en")
        entries, ranks, time = [], [], job.audio.offset + 1.0
        for word in words:
            heard = word.key in held and not (short and word.key in self.unheard)
            for token in word.tokens:
                entries.append(
                    TokenTiming(token, "", time, time + 0.2, probability if word.key in held else 0.01)
                )
                ranks.append(1 if heard else 7)
            time += 0.3
        return Transcript("align", "en", 30.0, "", [], [], entries, token_ranks=ranks)


def steps_of(samples, tokens, text: str):
    return alignment_steps(
        audible_windows(samples), tokens.encode(" " + text), tokens, "en", len(samples) / SAMPLE_RATE
    )


def drive(engine: FakeEngine, steps) -> dict:
    step, transcript = advance(steps, None)
    while step is not None:
        step, transcript = advance(steps, engine.run(*step))
    return transcript.to_dict()


@pytest.fixture
def five_windows(tokens):
    samples = np.random.default_rng(0).standard_normal(140 * SAMPLE_RATE).astype(np.float32) * 0.01
    windows = audible_windows(samples)
    assert len(windows) == 5
    spoken = [numbered(name, 12) for name in ("alpha", "beta", "gamma", "delta", "echo")]
    return samples, windows, spoken


def test_clean_text_takes_the_short_first_pass_alone(tokens, five_windows):
    samples, windows, spoken = five_windows
    engine = FakeEngine(tokens, windows, spoken)
    text = " ".join(spoken)
    body = drive(engine, steps_of(samples, tokens, text))
    assert engine.steps == [("p0-", [0, 1, 2, 3, 4], []), ("p1-", [], [0, 1, 2, 3, 4])]
    assert "".join(w["word"] for w in body["words"]).strip() == text
    assert all(w["aligned"] and w["probability"] == pytest.approx(0.9) for w in body["words"])
    starts = np.array([w["start"] for w in body["words"]])
    np.testing.assert_allclose(starts[::12], [w.offset + 1.0 for w in windows])


def test_only_the_windows_around_unheard_text_take_the_full_first_pass(tokens, five_windows):
    """Window 3's text fails the check, and still does with its boundaries shared: windows 2-4 are
    transcribed whole and aligned again; windows 0 and 1 keep the short pass's words."""
    samples, windows, spoken = five_windows
    engine = FakeEngine(tokens, windows, spoken, unheard={f"delta{i}" for i in range(12)})
    text = " ".join(spoken)
    body = drive(engine, steps_of(samples, tokens, text))
    assert engine.steps == [
        ("p0-", [0, 1, 2, 3, 4], []),
        ("p1-", [], [0, 1, 2, 3, 4]),
        ("z", [], [4, 2]),
        ("h", [2, 3, 4], []),
        ("a", [], [4, 3, 2]),
    ]
    words = body["words"]
    assert "".join(w["word"] for w in words).strip() == text
    assert all(w["aligned"] for w in words)
    probabilities = np.array([w["probability"] for w in words])
    np.testing.assert_allclose(probabilities, np.repeat([0.9, 0.8], [24, 36]))
    starts = np.array([w["start"] for w in words])
    np.testing.assert_allclose(starts[::12], [w.offset + 1.0 for w in windows])
    assert np.all(np.diff(starts) > 0)


def test_a_start_placed_late_is_mended_by_sharing_its_boundary(tokens, five_windows):
    """Window 3's transcript skips its first 5 words, so its prefix places it 5 words late and window
    2 is forced with them: they fail the check there. Shared with window 3 (forced again with them
    before its own; window 2's share is unchanged), they go to window 3, without a full first pass."""
    samples, windows, spoken = five_windows
    engine = FakeEngine(tokens, windows, spoken, skipped_start={3: 5})
    text = " ".join(spoken)
    body = drive(engine, steps_of(samples, tokens, text))
    assert engine.steps == [("p0-", [0, 1, 2, 3, 4], []), ("p1-", [], [0, 1, 2, 3, 4]), ("z", [], [3])]
    words = body["words"]
    assert "".join(w["word"] for w in words).strip() == text
    assert all(w["aligned"] and w["probability"] == pytest.approx(0.9) for w in words)
    starts = np.array([w["start"] for w in words])
    window_of_start = np.searchsorted([w.offset for w in windows], starts, side="right") - 1
    np.testing.assert_array_equal(window_of_start, np.repeat(np.arange(5), 12))


def test_the_short_pass_forces_each_block_while_the_next_is_heard(tokens, five_windows, monkeypatch):
    """A window's share is known once the next window is placed: each step hears a block and forces
    what the steps before placed, so a window's encoder output is still cached when it is forced.
    The words are those of the recording run in one block."""
    samples, windows, spoken = five_windows
    text = " ".join(spoken)
    whole = drive(FakeEngine(tokens, windows, spoken), steps_of(samples, tokens, text))
    monkeypatch.setattr(longform_steps, "PASS_BLOCK_WINDOWS", 2)
    engine = FakeEngine(tokens, windows, spoken)
    blocked = drive(engine, steps_of(samples, tokens, text))
    assert engine.steps == [
        ("p0-", [0, 1], []),
        ("p1-", [2, 3], [0]),
        ("p2-", [4], [1, 2]),
        ("p3-", [], [3, 4]),
    ]
    assert blocked["words"] == whole["words"]
