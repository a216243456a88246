"""The live policy without an engine: LocalAgreement, and the rolling buffer fed by a stand-in decoder
that hears exactly the words lying inside what it is given (the one cut by the buffer's end misheard)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from vllm_whisper_align.align.words import Word
from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.live import buffer as live_buffer
from vllm_whisper_align.live.agreement import Agreement
from vllm_whisper_align.live.buffer import RollingBuffer


def word(text: str, start: float, end: float) -> Word:
    return Word(start, end, text, 0.9)


def texts(words) -> list[str]:
    return [w.word.strip() for w in words]


def test_two_decodes_confirm_their_common_prefix_with_the_newer_times():
    agreement = Agreement()
    assert agreement.confirm([word(" a", 0.0, 0.4), word(" b", 0.5, 0.9)]) == []
    confirmed = agreement.confirm([word(" a", 0.02, 0.41), word(" b", 0.5, 0.8), word(" c", 1.0, 1.2)])
    assert texts(confirmed) == ["a", "b"]
    assert (confirmed[0].start, confirmed[1].end) == (0.02, 0.8)  # the newer decode's times
    assert texts(agreement.tail) == ["c"]


def test_a_disagreement_stops_the_confirmation_there():
    agreement = Agreement()
    agreement.confirm([word(" a", 0.0, 0.4), word(" bee", 0.5, 0.9), word(" sea", 1.0, 1.2)])
    second = agreement.confirm([word(" a", 0.0, 0.4), word(" be", 0.5, 0.9), word(" c", 1.0, 1.2)])
    assert texts(second) == ["a"]
    assert texts(agreement.confirm([word(" be", 0.5, 0.9), word(" c", 1.0, 1.2)])) == ["be", "c"]


def test_case_and_punctuation_do_not_hold_a_word_back():
    """A decode that ends at "mat" and the next, which hears the next sentence begin, agree on it: the
    word is confirmed as the newer decode writes it. A lone dash agrees only with a dash."""
    agreement = Agreement()
    agreement.confirm([word(" the", 0.0, 0.3), word(" mat", 0.4, 0.8), word(" -", 0.9, 1.0)])
    confirmed = agreement.confirm([word(" The", 0.0, 0.3), word(" mat.", 0.4, 0.8), word(" ,", 0.9, 1.0)])
    assert texts(confirmed) == ["The", "mat."]


def test_a_word_read_two_ways_between_agreeing_words_is_confirmed_as_the_newer_decode_reads_it():
    agreement = Agreement()
    agreement.confirm([word(" The", 0.5, 0.8), word(" cat", 0.92, 1.3), word(" sat", 1.5, 1.9)])
    confirmed = agreement.confirm([word(" A", 0.52, 0.8), word(" cat", 0.92, 1.3), word(" sad", 1.5, 1.9)])
    assert texts(confirmed) == ["A", "cat"]  # "sat" / "sad": nothing agrees after it, it waits
    # Read two ways at different places, it is two words, not one: nothing is confirmed.
    agreement = Agreement()
    agreement.confirm([word(" The", 0.5, 0.8), word(" cat", 0.92, 1.3)])
    assert agreement.confirm([word(" A", 0.1, 0.3), word(" cat", 0.92, 1.3)]) == []


def test_confirmed_words_said_again_at_a_decodes_start_are_not_confirmed_twice():
    agreement = Agreement()
    agreement.confirm([word(" one", 0.0, 0.3), word(" two", 0.4, 0.7)])
    agreement.confirm([word(" one", 0.0, 0.3), word(" two", 0.4, 0.7)])
    # The buffer still holds "two": a decode hears it again, placed a little later than before.
    agreement.confirm([word(" two", 0.62, 0.9), word(" three", 1.0, 1.3)])
    confirmed = agreement.confirm(
        [word(" two", 0.62, 0.9), word(" three", 1.0, 1.3), word(" four", 1.4, 1.6)]
    )
    assert texts(confirmed) == ["three"]


def test_a_word_one_decode_skips_between_words_both_agree_on_is_kept():
    """Small models drop a word from one decode to the next ("there might be prudently in" and "there
    might be in"): the word one of two decodes heard, where both go on alike, is confirmed."""
    agreement = Agreement()
    agreement.confirm([word(" be", 0.0, 0.3), word(" prudently", 0.4, 0.8), word(" in", 0.9, 1.0)])
    confirmed = agreement.confirm([word(" be", 0.0, 0.3), word(" in", 0.85, 1.0), word(" his", 1.1, 1.3)])
    assert texts(confirmed) == ["be", "prudently", "in"]
    # The other way round: the newer decode hears the word the older one skipped.
    agreement = Agreement()
    agreement.confirm([word(" be", 0.0, 0.3), word(" in", 0.9, 1.0), word(" his", 1.1, 1.3)])
    confirmed = agreement.confirm([word(" be", 0.0, 0.3), word(" wisely", 0.4, 0.8), word(" in", 0.85, 1.0)])
    assert texts(confirmed) == ["be", "wisely", "in"]
    # A word at another place is not the same word skipped: nothing after "be" is confirmed.
    agreement = Agreement()
    agreement.confirm([word(" be", 0.0, 0.3), word(" in", 0.9, 1.0), word(" his", 1.1, 1.3)])
    confirmed = agreement.confirm([word(" be", 0.0, 0.3), word(" wisely", 0.4, 0.8), word(" in", 1.5, 1.6)])
    assert texts(confirmed) == ["be"]


def test_a_confirmed_word_placed_later_by_a_decode_does_not_swallow_the_next():
    """The confirmed "rather" ended at 3.75 s in the decode that confirmed it; the next decodes place
    it at 3.44-3.62 and "selfish" from 3.62: the decode goes on after its own "rather", not after
    3.75 s."""
    agreement = Agreement()
    agreement.confirm([word(" and", 3.06, 3.44), word(" rather", 3.44, 3.75), word(" as", 3.75, 3.97)])
    agreement.confirm([word(" and", 3.06, 3.44), word(" rather", 3.44, 3.75), word(" self", 3.97, 4.1)])
    heard = [word(" rather", 3.44, 3.62), word(" selfish", 3.62, 4.12), word(" is", 4.12, 4.9)]
    agreement.confirm(heard)
    confirmed = agreement.confirm([*heard, word(" to", 4.95, 5.1), word(" be", 5.1, 5.2)])
    assert texts(agreement.in_buffer) == ["and", "rather", "selfish", "is"]
    assert texts(confirmed) == ["selfish", "is"]


class StandInDecoder:
    """Hears the words of ``truth`` inside the audio it is given (times relative to it); a word the
    buffer's end cuts is misheard ("...")."""

    def __init__(self, truth: list[Word]):
        self.truth = truth

    def __call__(self, decode: live_buffer.Decode) -> list[Word]:
        end = decode.offset + len(decode.samples) / SAMPLE_RATE
        heard = []
        for w in self.truth:
            if w.start >= decode.offset and w.end <= end:
                heard.append(word(w.word, w.start - decode.offset, w.end - decode.offset))
            elif w.start >= decode.offset and w.start < end:
                heard.append(word(" ...", w.start - decode.offset, end - decode.offset))
                break
        return heard


def speech(num_sentences: int, words_per_sentence: int = 6, word_s: float = 0.4, gap_s: float = 0.15):
    """Sentences of words (the last of each ends with a full stop) and a matching length of audio."""
    truth, t = [], 0.5
    for s in range(num_sentences):
        for w in range(words_per_sentence):
            last = w == words_per_sentence - 1
            truth.append(word(f" w{s}-{w}{'.' if last else ''}", round(t, 2), round(t + word_s, 2)))
            t += word_s + (0.6 if last else gap_s)
    return truth, np.zeros(int((t + 1.0) * SAMPLE_RATE), dtype=np.float32)


def stream(
    samples: np.ndarray, decoder, chunk_s: float, buffer: RollingBuffer | None = None
) -> tuple[list[Word], list[float]]:
    """``samples`` fed ``chunk_s`` at a time into ``buffer`` (default a new one), each decode that is
    due run at once; every confirmed word, and the buffer's length after each decode."""
    buffer, confirmed, lengths = buffer or RollingBuffer(), [], []
    step = int(chunk_s * SAMPLE_RATE)
    for start in range(0, len(samples), step):
        buffer.append(samples[start : start + step])
        if start + step >= len(samples):
            buffer.end()
        while buffer.wants_decode():
            decode = buffer.next_decode()
            assert len(decode.samples) <= live_buffer.WINDOW_S * SAMPLE_RATE
            confirmed += buffer.take(decode, decoder(decode)).confirmed
            lengths.append(buffer.seconds)
    confirmed += buffer.finish().confirmed
    return confirmed, lengths


@pytest.mark.parametrize("chunk_s", [0.1, 0.37, 8.0])  # real time in small chunks, odd chunks, a file at once
def test_every_word_is_confirmed_once_in_order_with_its_times(chunk_s):
    truth, samples = speech(12)
    confirmed, lengths = stream(samples, StandInDecoder(truth), chunk_s)
    assert [(w.word, w.start, w.end) for w in confirmed] == [(w.word, w.start, w.end) for w in truth]
    # Trimmed at sentence ends: the buffer never holds much more than TRIM_AFTER_S.
    assert max(lengths) <= live_buffer.TRIM_AFTER_S + live_buffer.MAX_STEP_S


def test_speech_without_a_sentence_end_keeps_the_buffer_within_a_window():
    truth, samples = speech(1, words_per_sentence=120)  # one 66 s sentence: no full stop until its end
    confirmed, lengths = stream(samples, StandInDecoder(truth), 0.5)
    assert max(lengths) <= live_buffer.WINDOW_S
    assert texts(confirmed) == texts(truth)


def test_the_prompt_is_the_confirmed_text_before_the_buffer():
    truth, samples = speech(6)
    buffer, decoder = RollingBuffer(), StandInDecoder(truth)
    buffer.append(samples)
    prompts = []
    while buffer.wants_decode():
        decode = buffer.next_decode()
        prompts.append((decode.offset, decode.prompt))
        buffer.take(decode, decoder(decode))
    offset, prompt = next((o, p) for o, p in prompts if o > 0)
    assert prompt == "".join(w.word for w in truth if w.end <= offset).strip()


def test_audio_waits_as_it_came_and_decodes_take_it_in_order():
    """PCM16 from a socket waits as PCM16 (half the memory of float32 for a client far ahead); a decode
    takes in the first MAX_STEP_S of it, whatever the chunks, as float, and the rest waits on."""
    pcm = (np.arange(int(2.5 * live_buffer.MAX_STEP_S * SAMPLE_RATE)) % 2000 - 1000).astype(np.int16)
    floats = np.linspace(-0.5, 0.5, SAMPLE_RATE, dtype=np.float32)
    buffer = RollingBuffer(max_waiting_s=3 * live_buffer.MAX_STEP_S)
    for chunk in np.array_split(pcm, 7):
        buffer.append(chunk)
    buffer.append(floats)
    assert {chunk.dtype for chunk in buffer.arrived.chunks} == {np.dtype(np.int16), np.dtype(np.float32)}
    assert buffer.new_seconds == pytest.approx(2.5 * live_buffer.MAX_STEP_S + 1)
    assert buffer.has_room

    step = int(live_buffer.MAX_STEP_S * SAMPLE_RATE)
    taken = [buffer.next_decode().samples[-step:] for _ in range(2)]
    assert taken[0].dtype == np.float32
    np.testing.assert_array_equal(np.concatenate(taken), pcm[: 2 * step] / 32768.0)
    assert buffer.new_seconds == pytest.approx(0.5 * live_buffer.MAX_STEP_S + 1)
    rest = buffer.next_decode().samples[2 * step :]
    np.testing.assert_array_equal(rest, np.concatenate([pcm[2 * step :] / 32768.0, floats]))
    assert len(buffer.arrived) == 0 and not buffer.arrived.chunks


def test_a_buffer_has_room_while_less_than_its_bound_waits():
    buffer = RollingBuffer(max_waiting_s=2.0)
    buffer.append(np.zeros(SAMPLE_RATE, dtype=np.int16))
    assert buffer.has_room and buffer.following().max_waiting_s == 2.0
    buffer.append(np.zeros(SAMPLE_RATE, dtype=np.int16))
    assert not buffer.has_room
    assert RollingBuffer().max_waiting_s == live_buffer.MAX_WAITING_S


def test_the_audio_after_the_end_is_refused():
    buffer = RollingBuffer()
    buffer.end()
    with pytest.raises(ValueError):
        buffer.append(np.zeros(10, dtype=np.float32))
    assert buffer.following().offset == 0.0


class FirstWordFlips(StandInDecoder):
    """As StandInDecoder, but the first word it hears flips between two readings ("The" and "A") from
    one decode to the next: the tail's first word never agrees with the previous decode's."""

    calls = 0

    def __call__(self, decode):
        heard = super().__call__(decode)
        self.calls += 1
        if heard and self.calls % 2:
            heard[0] = word(" flip", heard[0].start, heard[0].end)
        return heard


def test_a_word_that_never_agrees_does_not_lose_the_words_behind_it():
    truth, samples = speech(1, words_per_sentence=120)  # no sentence end to trim at: the window fills
    confirmed, lengths = stream(samples, FirstWordFlips(truth), 0.5)
    assert max(lengths) <= live_buffer.WINDOW_S
    spoken = texts(truth)
    assert len(confirmed) == len(truth)
    assert sum(a != b for a, b in zip(texts(confirmed), spoken, strict=True)) <= len(truth) // 10


def test_stdin_chunks_read_pcm16_as_it_comes_and_refuse_an_odd_byte():
    import io

    from vllm_whisper_align.errors import InputError
    from vllm_whisper_align.live.sources import stdin_chunks

    pcm = (np.arange(-2000, 2000, dtype="<i2") * 8).tobytes()
    chunks = list(stdin_chunks(io.BufferedReader(io.BytesIO(pcm))))
    np.testing.assert_array_equal(np.concatenate(chunks), np.frombuffer(pcm, "<i2") / 32768.0)
    assert all(len(chunk) <= 1600 for chunk in chunks)
    with pytest.raises(InputError, match="odd number of bytes"):
        list(stdin_chunks(io.BufferedReader(io.BytesIO(pcm + b"\0"))))


def test_a_source_is_read_no_further_ahead_than_the_buffer_has_room_for():
    """A pipe or a file sent at once (the CLI's in-process stream): its reader waits while
    MAX_WAITING_S of audio waits for decodes, and goes on as decodes take audio in."""
    import queue
    import time

    from vllm_whisper_align.live.sources import CHUNK_S
    from vllm_whisper_align.runners import live

    chunk = np.zeros(int(CHUNK_S * SAMPLE_RATE), dtype=np.float32)
    total = int(3 * live_buffer.MAX_WAITING_S / CHUNK_S)
    read = []

    def source():
        for index in range(total):
            read.append(index)
            yield chunk

    arrived: queue.Queue = queue.Queue(maxsize=live_buffer.READ_AHEAD_CHUNKS)
    reader = live._start_reading(source(), arrived)
    buffer = RollingBuffer()
    deadline = time.monotonic() + 30
    while (buffer.has_room or not arrived.full()) and time.monotonic() < deadline:
        live._receive(buffer, arrived, block=False)
        time.sleep(0.01)
    assert arrived.full() and not buffer.has_room, (arrived.qsize(), buffer.new_seconds)
    ahead = live_buffer.MAX_WAITING_S / CHUNK_S + live_buffer.READ_AHEAD_CHUNKS + 2
    assert len(read) <= ahead, (len(read), ahead)
    while not buffer.ended or buffer.arrived:
        live._receive(buffer, arrived, block=not buffer.wants_decode())
        if buffer.wants_decode():
            buffer.next_decode()
    reader.join(timeout=30)
    assert len(read) == total and buffer.stream_seconds == pytest.approx(total * CHUNK_S)


def test_the_realtime_client_reads_no_further_ahead_than_the_server_takes():
    """A server that has stopped reading (its stream is full): the client's reader of a pipe waits too,
    a few chunks ahead, instead of reading the whole pipe into memory."""
    import asyncio
    import time

    from vllm_whisper_align.realtime_client import _send_audio

    read = []

    def source():
        for index in range(1000):
            read.append(index)
            yield np.zeros(1600, dtype=np.float32)

    class StalledSocket:
        sent = 0

        async def send(self, message: str) -> None:
            self.sent += 1
            if self.sent > 3:
                await asyncio.Event().wait()  # the server reads no more

    async def stalled() -> int:
        sender = asyncio.create_task(_send_audio(StalledSocket(), source()))
        started = time.monotonic()
        while len(read) < 1000 and time.monotonic() - started < 2:
            await asyncio.sleep(0.05)
        sender.cancel()
        return len(read)

    assert asyncio.run(stalled()) <= 3 + live_buffer.READ_AHEAD_CHUNKS + 2, len(read)


def test_realtime_url_of_a_server():
    from vllm_whisper_align.errors import InputError
    from vllm_whisper_align.realtime_client import realtime_url

    assert realtime_url("http://h:8000") == "ws://h:8000/v1/realtime"
    assert realtime_url("https://h/api/") == "wss://h/api/v1/realtime"
    assert realtime_url("ws://h:1/v1/realtime") == "ws://h:1/v1/realtime"
    assert realtime_url("h:8000") == "ws://h:8000/v1/realtime"
    with pytest.raises(InputError):
        realtime_url("ftp://h")


def test_a_decodes_last_word_waits_until_a_decode_hears_past_it():
    """Two decodes that both end at "sister." (the next word begun, not written yet) confirm "My"
    only; once a decode has heard a while past it, "sister." is confirmed as that decode writes it."""
    agreement = Agreement()
    agreement.confirm([word(" My", 0.5, 0.8), word(" sister.", 0.9, 1.4)], heard_until=1.5)
    assert texts(agreement.confirm([word(" My", 0.5, 0.8), word(" sister.", 0.9, 1.4)], 2.0)) == ["My"]
    assert texts(agreement.confirm([word(" sister.", 0.9, 1.4)], heard_until=2.5)) == ["sister."]


def test_a_word_the_newer_decode_did_not_reach_waits_where_the_audio_holds_speech():
    """A decode heard "the worm mat."; the next wrote "the worm." and ended, neither agreeing on
    "mat." nor reading anything else there. Where the audio holds speech the word waits for the next
    decode (and the stream's end confirms it); a word written into silence ("Thank you.") goes, as do
    a word the newer decode went past and every word before a decode that wrote none."""
    heard = [word(" the", 3.3, 3.6), word(" worm", 3.78, 4.28)]
    for last, spoken, kept in ((" mat.", True, ["mat."]), (" Thank you.", False, [])):
        agreement = Agreement()
        agreement.confirm([*heard, word(last, 4.62, 4.86)])
        assert texts(
            agreement.confirm([*heard[:1], word(" worm.", 3.78, 4.28)], spoken=lambda w, s=spoken: s)
        ) == ["the", "worm."]
        assert texts(agreement.confirm_tail()) == kept
    agreement = Agreement()
    agreement.confirm([*heard, word(" mat.", 4.62, 4.86)])
    agreement.confirm([*heard, word(" met", 4.5, 4.9)], heard_until=5.0, spoken=lambda w: True)
    assert texts(agreement.tail) == ["met"]
    # A decode that wrote nothing heard nothing it could read: the words before it go.
    agreement = Agreement()
    agreement.confirm([word(" Addy.", 0.9, 1.5)])
    agreement.confirm([], spoken=lambda w: True)
    assert agreement.tail == []


def test_a_streams_last_word_is_kept_when_its_last_decode_ends_before_it():
    """Spoken audio (espeak) streamed through the buffer, decoded by a stand-in that hears every word
    inside what it is given but, once the audio has ended, stops before the last one (as tiny.en did
    at the end of "the cat sat on the warm mat": "the worm." then no more): the last word is confirmed
    from the decodes before. The same decoder writing "Thank you." into the silence after the speech,
    once, leaves no such word."""
    from tests.support.speech import synthesize_words

    def decoder(truth: list[Word], buffer: RollingBuffer, ends_early: bool, invented: Word | None):
        decodes = []  # the one decode that invented a word

        def decode(d: live_buffer.Decode) -> list[Word]:
            end = d.offset + len(d.samples) / SAMPLE_RATE
            words = [w for w in truth if w.end <= end]
            if buffer.ended and not buffer.arrived and ends_early:
                words = words[:-1]
            if invented is not None and not decodes and invented.end <= end:
                words.append(invented)
                decodes.append(words)
            return [replace(w, start=w.start - d.offset, end=w.end - d.offset) for w in words]

        return decode

    # The last word ends 0.5 s before the audio: no decode before the last heard far enough past it.
    for tail_s, ends_early, invents in ((0.5, True, False), (1.5, False, True)):
        clip = synthesize_words(["the", "warm", "mat"], gap_s=0.3, tail_s=tail_s)
        truth = [word(f" {w}", s, e) for w, s, e in zip(clip.words, clip.starts, clip.ends, strict=True)]
        invented = word(" Thank you.", clip.ends[-1] + 0.3, clip.ends[-1] + 1.0) if invents else None
        buffer = RollingBuffer()
        confirmed, _ = stream(clip.samples, decoder(truth, buffer, ends_early, invented), 0.1, buffer)
        assert texts(confirmed) == ["the", "warm", "mat"]


def test_a_decode_not_believed_leaves_the_words_the_next_one_is_compared_with():
    """A looped decode (``take(..., None)``) confirms nothing and wipes nothing: the decode after it
    confirms what it and the decode before the loop agree on."""
    buffer = RollingBuffer()
    heard = [word(" one", 0.1, 0.4), word(" two", 0.5, 0.8)]
    for words in (heard, None, [*heard, word(" three", 1.0, 1.2)]):
        buffer.append(np.zeros(SAMPLE_RATE, dtype=np.float32))
        update = buffer.take(buffer.next_decode(), words)
    assert texts(update.confirmed) == ["one", "two"]


def test_a_stream_is_at_rest_only_with_nothing_of_it_decoded_or_due():
    """The server closes a quiet stream only at rest (server/realtime.py): never one whose audio waits
    for a decode, is in one, or has ended and waits for its last words."""
    from vllm_whisper_align.runners.live import LiveStream

    stream = LiveStream("s")
    assert stream.at_rest
    stream.buffer.append(np.zeros(int(live_buffer.STEP_S * SAMPLE_RATE), dtype=np.float32))
    assert not stream.at_rest  # a decode is due
    stream.buffer.next_decode()
    stream.busy = True
    assert not stream.at_rest  # in a round
    stream.busy = False
    assert stream.at_rest
    stream.buffer.end()
    assert not stream.at_rest  # its last words are still to come


class TokenedStandInDecoder(StandInDecoder):
    """As StandInDecoder, with tokens on each word (a decode's words as the engine gives them); it keeps
    each decode's prefix beside the confirmed words ``buffer`` held when the decode was asked for."""

    def __init__(self, truth: list[Word], buffer: RollingBuffer):
        super().__init__([Word(w.start, w.end, w.word, w.probability, [i]) for i, w in enumerate(truth)])
        self.buffer = buffer
        self.prefixes: list[tuple[list[str], list[str]]] = []

    def __call__(self, decode):
        self.prefixes.append((texts(decode.prefix), texts(self.buffer.agreement.in_buffer)))
        heard = super().__call__(decode)
        tokened = [w for w in self.truth if w.start >= decode.offset]
        return [replace(h, tokens=t.tokens) for h, t in zip(heard, tokened, strict=False)]


def test_a_decode_is_given_the_confirmed_words_of_its_buffer_but_its_last_few():
    """A decode is given the confirmed words of its buffer, forced rather than decoded again, all but
    the last PREFIX_REREAD_WORDS, which it reads again (where its own text goes on from)."""
    truth, samples = speech(12)
    buffer = RollingBuffer()
    decoder = TokenedStandInDecoder(truth, buffer)
    confirmed, _ = stream(samples, decoder, 0.1, buffer)
    assert [(w.word, w.start, w.end) for w in confirmed] == [(w.word, w.start, w.end) for w in truth]
    for prefix, in_buffer in decoder.prefixes:
        assert prefix == in_buffer[: len(in_buffer) - live_buffer.PREFIX_REREAD_WORDS]
    assert max(len(prefix) for prefix, _ in decoder.prefixes) > 3  # later decodes start after what is known


def test_a_prefixed_decodes_words_are_confirmed_once_however_it_reads_its_prefix():
    """A decode's first words are its prefix, confirmed already, read with a mark after the last
    ("three" given, "three." read) or its word run on ("three" given, "threefold" read): only the
    words after the confirmed ones are new."""
    names = "one two three four five six seven".split()
    heard = [replace(word(f" {n}", 0.2 * i, 0.2 * i + 0.1), tokens=[i]) for i, n in enumerate(names)]
    for reading in (" three.", " threefold"):
        buffer, confirmed = RollingBuffer(), []
        for words in (heard[:5], heard[:5], None, heard, heard):
            buffer.append(np.zeros(SAMPLE_RATE, dtype=np.float32))
            decode = buffer.next_decode()
            if words is None:  # the decode given "one two three", reading it otherwise
                assert texts(decode.prefix) == ["one", "two", "three"]
                words = [*heard[:2], replace(heard[2], word=reading), *heard[3:6]]
            confirmed += buffer.take(decode, words).confirmed
        confirmed += buffer.finish().confirmed
        assert texts(confirmed) == names


def test_no_prefix_is_given_where_a_confirmed_word_has_no_tokens():
    """Words without tokens (a window too short to align reads none here) cannot be forced again."""

    def prefix_after(heard):
        buffer = RollingBuffer()
        for _ in range(2):
            buffer.append(np.zeros(SAMPLE_RATE, dtype=np.float32))
            buffer.take(buffer.next_decode(), heard)
        buffer.append(np.zeros(SAMPLE_RATE, dtype=np.float32))
        return texts(buffer.next_decode().prefix)

    heard = [
        word(f" {text}", 0.15 * i, 0.15 * i + 0.1) for i, text in enumerate("one two three four five".split())
    ]
    tokened = [replace(w, tokens=[i]) for i, w in enumerate(heard)]
    assert prefix_after(tokened) == ["one", "two", "three"]  # "four" and "five" are read again
    tokened[1] = replace(tokened[1], tokens=[])
    assert prefix_after(tokened) == []
