"""A packed window's answer split back into its inputs' (``audio.packing`` lays them out).

The window was decoded once, its text running across every input. Which input each word belongs to is
read from the window's attention (:func:`owners`): each word's tokens look at the audio where they are
spoken, and words follow the inputs in order. Each input then gets its own tokens and its own DTW, run
on its block of the captured attention (the window's start rows and its text rows × its encoder
frames, softmaxed and normalised as if it were alone), so that its word times are read, and its
boundaries moved, on its own audio exactly as an input run alone is.

An input whose words cannot be told apart from its neighbours' gets no part (None), and runs again
alone: one with no words (its speech went unheard, or the decode stopped early), and one with a word
whose tokens look at two inputs (Whisper ran a word across the gap). Once timed, an input's words are
checked against its own audio (:func:`holds_its_own_words`): where neighbours say the same words, the
split can give an input words read from a neighbour, or its own words to a neighbour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from vllm_whisper_align.align import timing
from vllm_whisper_align.align.results import (
    DecodedWindow,
    TimedWindow,
    WindowOutput,
    alignment_heads,
    captured_qk,
    window_matrix,
)
from vllm_whisper_align.align.words import Word, split_to_word_tokens
from vllm_whisper_align.audio.features import SPEECH_FRAME_SECONDS, speech_frames
from vllm_whisper_align.audio.packing import Packed
from vllm_whisper_align.audio.windows import AudioChunk
from vllm_whisper_align.constants import num_mel_frames
from vllm_whisper_align.options import compression_ratio
from vllm_whisper_align.protocol import AlignmentParams
from vllm_whisper_align.tokens import WhisperTokens


def input_scores(matrix: np.ndarray, packed: Packed) -> np.ndarray:
    """(rows, inputs): how strongly each row of the window's DTW matrix (each text token's, and eot's)
    looks at each input's audio (its peak there; the gaps count for none)."""
    return np.stack([matrix[:, packed.frames(i)].max(axis=1) for i in range(len(packed))], axis=1)


class WordTokens(NamedTuple):
    """A word's tokens by position in the window's text: ``spoken`` of them, then its marks."""

    positions: list[int]
    spoken: int


def word_groups(token_ids: Sequence[int], tokens: WhisperTokens, language: str) -> list[WordTokens]:
    """The window's text tokens in words, a punctuation mark kept with the word before it (it ends that
    input's sentence, it does not start the next one's)."""
    _, word_tokens = split_to_word_tokens(
        [*token_ids, tokens.eot], tokens.decode_with_special, tokens.eot, language
    )
    groups: list[WordTokens] = []
    position = 0
    for group in word_tokens[:-1]:  # the last group is eot's
        positions = list(range(position, position + len(group)))
        position += len(group)
        if groups and not is_spoken(tokens.decode(group)):
            groups[-1].positions.extend(positions)
        else:
            groups.append(WordTokens(positions, len(positions)))
    return groups


def is_spoken(text: str) -> bool:
    """Whether a word's text is something said (a letter or digit), not punctuation alone."""
    return any(character.isalnum() for character in text)


def owners(scores: np.ndarray, groups: Sequence[WordTokens]) -> list[int]:
    """The input of each word: the assignment, in order (a word's input is never before the previous
    word's), whose words look hardest at their own inputs (the sum of their tokens' mean scores)."""
    word_scores = np.array([scores[word_rows(group)].mean(axis=0) for group in groups])
    num_words, num_inputs = word_scores.shape
    best = np.empty_like(word_scores)
    came_from = np.zeros((num_words, num_inputs), dtype=np.int64)
    best[0] = word_scores[0]
    for w in range(1, num_words):
        # the best total so far ending at any input up to each one
        running = np.maximum.accumulate(best[w - 1])
        came_from[w] = [int(np.argmax(best[w - 1][: i + 1])) for i in range(num_inputs)]
        best[w] = word_scores[w] + running
    owner = [int(np.argmax(best[-1]))]
    for w in range(num_words - 1, 0, -1):
        owner.append(int(came_from[w][owner[-1]]))
    return owner[::-1]


def word_rows(group: WordTokens) -> slice:
    """The rows of the window's matrix that look at where a word is spoken: those predicting its
    spoken tokens and the one after them (fed its last token; it still attends to the word, and keeps
    a word that opens an input, after the gap, from being read into the input before)."""
    return slice(group.positions[0], group.positions[group.spoken - 1] + 2)


def token_ranges(
    scores: np.ndarray, groups: Sequence[WordTokens], num_inputs: int
) -> list[tuple[int, int] | None]:
    """Each input's text tokens, [first, stop) of the window's; None for an input that runs alone: no
    words, or a word whose spoken tokens look hardest at different inputs."""
    owner_of = owners(scores, groups) if groups else []
    ranges: list[tuple[int, int] | None] = []
    for index in range(num_inputs):
        mine = [group for group, owner in zip(groups, owner_of, strict=True) if owner == index]
        crossing = any(
            len(set(np.argmax(scores[group.positions[: group.spoken]], axis=1))) > 1 for group in mine
        )
        ranges.append(None if not mine or crossing else (mine[0].positions[0], mine[-1].positions[-1] + 1))
    return ranges


def part_output(output: WindowOutput, first: int, stop: int, tokens: WhisperTokens) -> WindowOutput:
    """An input's share of the window's output. Its average log-probability is over its tokens and an
    end (openai-whisper's len + 1), the end certain: inside a pack no eot follows an input's text."""
    token_ids = output.token_ids[first:stop]
    logprobs = output.token_logprobs[first:stop]
    return WindowOutput(
        token_ids,
        logprobs,
        avg_logprob=sum(logprobs) / (len(token_ids) + 1),
        compression_ratio=compression_ratio(tokens.decode(token_ids).strip()),
        no_speech_prob=output.no_speech_prob,
        temperature=output.temperature,
        token_ranks=None if output.token_ranks is None else output.token_ranks[first:stop],
    )


def given_ranges(counts: Sequence[int]) -> list[tuple[int, int] | None]:
    """The token ranges of given texts packed in order (forced alignment: the split is exact)."""
    stops = np.cumsum(counts)
    return [(int(stop - count), int(stop)) for count, stop in zip(counts, stops, strict=True)]


def block_matrix(
    cross_qk: np.ndarray, params: AlignmentParams, fetched: dict, first: int, stop: int, frames: slice
) -> np.ndarray:
    """The DTW's input for one input of the window: the window's start rows and the rows predicting
    its tokens and what follows them, over its own encoder frames, normalised among themselves."""
    start_rows = params.text_rows(0).start  # sot … before the first text-predicting row
    rows = slice(start_rows + first, start_rows + stop + 1)
    qk = np.concatenate([cross_qk[:, :start_rows], cross_qk[:, rows]], axis=1)[:, :, frames]
    num_frames = 2 * qk.shape[-1]
    text = slice(start_rows, qk.shape[1])
    heads = alignment_heads(qk[:, text], num_frames, params, fetched)
    matrix = timing.alignment_matrix(qk[heads], num_frames, params.medfilt_width, params.qk_scale)
    return matrix[text]


def split_window(
    packed: Packed,
    inputs: Sequence[np.ndarray],
    output: WindowOutput,
    params: AlignmentParams,
    fetched: dict,
    tokens: WhisperTokens,
    language: str,
    forced: Sequence[int] | None = None,
) -> list[TimedWindow | None]:
    """Each input's window with its own token times, as if it had been decoded alone; None for an
    input that must run alone. ``forced``: the token counts of given texts packed in order, which split
    the window exactly. ``ValueError`` where the worker has no capture for the window."""
    if forced is None:
        whole = DecodedWindow(AudioChunk.whole(packed.samples), output, params)
        scores = input_scores(window_matrix(whole, fetched), packed)
        ranges = token_ranges(scores, word_groups(output.token_ids, tokens, language), len(packed))
    else:
        ranges = given_ranges(forced)
    cross_qk = captured_qk(fetched)
    parts: list[tuple[DecodedWindow, np.ndarray] | None] = []
    for index, span in enumerate(ranges):
        if span is None:
            parts.append(None)
            continue
        samples = inputs[index]
        window = DecodedWindow(
            AudioChunk.whole(samples),
            part_output(output, *span, tokens),
            replace(params, num_frames=num_mel_frames(len(samples))),
            forced=forced is not None,
        )
        parts.append((window, block_matrix(cross_qk, params, fetched, *span, packed.frames(index))))
    kept = [part for part in parts if part is not None]
    times = iter(timing.jump_times_batch([matrix for _, matrix in kept]))
    return [None if part is None else TimedWindow(part[0], next(times), None, part[1]) for part in parts]


# ---------------------------------------------------------------------------- its own words?

# Words that DTW squeezes into no time are words the audio does not hold: no one says this many words in
# a row in this little time (a syllable takes about 0.1 s). openai-whisper's word anomaly score (short,
# long or improbable words) was tried first: it also flagged a third of the packed 8 s clips of fast
# continuous speech, whose short words are short.
SQUEEZED_WORDS = 3
SQUEEZED_S = 0.1
# Speech of an input that none of its words covers for this long went unheard there, or to a neighbour:
# longer than the cut-off words at a clip's edges, or a phrase Whisper skips now and then.
MAX_UNHEARD_SPEECH_S = 2.0


def holds_its_own_words(words: Sequence[Word], samples: np.ndarray) -> bool:
    """Whether a packed input's timed words read as its own audio: none squeezed into no time (a
    neighbour's words given to it), and no long stretch of its speech without a word (its words given to
    a neighbour). Where two neighbours say the same words, Whisper reads one's and looks at the other's
    audio, and the split follows its attention."""
    spoken = [word for word in words if is_spoken(word.word)]
    squeezed = any(
        spoken[k + SQUEEZED_WORDS - 1].end - spoken[k].start < SQUEEZED_S
        for k in range(len(spoken) - SQUEEZED_WORDS + 1)
    )
    return not squeezed and longest_unheard_speech(words, samples) <= MAX_UNHEARD_SPEECH_S


def longest_unheard_speech(words: Sequence[Word], samples: np.ndarray) -> float:
    """The most speech (seconds) in ``samples`` between two words, or before the first or after the
    last, that no word covers."""
    speech = speech_frames(samples)
    edges = [0, *(int(round(t / SPEECH_FRAME_SECONDS)) for word in words for t in (word.start, word.end))]
    edges.append(len(speech))
    between = [speech[a:b].sum() for a, b in zip(edges[0::2], edges[1::2], strict=True)]
    return float(max(between) * SPEECH_FRAME_SECONDS)
