"""The live policy (``live/``) in-process, on a virtual clock: each recording's audio arrives at real
time, and each decode takes the time it really took (or ``--decode-s``, for runs that compare policies
without the machine's jitter). A tool for changing the policy, not the benchmark of record (that is
streaming_bench.py, through a real server and WebSocket client).

    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/live_policy.py --real 4 [--method heads] [-v]
    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/live_policy.py --held-out --real 8
    flock -x /tmp/vwa-bench.lock .venv/bin/python benchmarks/live_policy.py --prefixes --real 4

``--held-out`` streams recordings the bench's set does not hold, to check a policy change made while
reading the bench's set: its synthetic sentences in two other orders, the joined real pairs that begin
with another sentence than the bench's, and every other real clip alone.

Per recording and in all: the delay of each confirmed word (the virtual time it was confirmed, less
the end of the audio that holds its end), each decode's time, the WER of the streamed words against
the offline transcription of the same audio, starts within 50 ms of the truth, and sentence ends
(words ending in . ? !) streamed and offline.

``--prefixes`` streams nothing: it decodes each recording's first seconds, ``STEP_S`` more at a time
(from its start: more audio than a live buffer holds once trimmed), and counts the offline words that
the first such decode to hear ``LAST_WORD_HEARD_AFTER_S`` past them reads otherwise (pairs with no equal
word), and those that it and the next both read otherwise: words no policy that confirms from those
decodes gets as offline does, short of waiting longer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from streaming_bench import CHUNK_S, plain, recordings, within  # noqa: E402

from tests.support import real_speech  # noqa: E402
from tests.support.speech import align_words, concatenate_clips, sentence_clips, word_errors  # noqa: E402
from vllm_whisper_align.constants import SAMPLE_RATE  # noqa: E402
from vllm_whisper_align.live.agreement import LAST_WORD_HEARD_AFTER_S  # noqa: E402
from vllm_whisper_align.live.buffer import STEP_S, RollingBuffer  # noqa: E402
from vllm_whisper_align.options import TranscriptionOptions  # noqa: E402
from vllm_whisper_align.runners.live import believed_words, decode_work  # noqa: E402

# The bench's joined real pairs are the first ones (those that begin with the first sentence, then the
# second); the held-out pairs start after as many as the bench's set reads at most here.
HELD_OUT_PAIRS_FROM = 8


def held_out(num_real: int) -> list[tuple[str, object]]:
    sentences = sentence_clips()
    synthetic = [
        ("synthetic", concatenate_clips([sentences[i] for i in order]))
        for order in ((1, 3, 5, 7), (6, 4, 2, 0))
    ]
    clips = real_speech.load_clips(log=lambda *_: None)
    joined = real_speech.joined_with_pauses(clips)[HELD_OUT_PAIRS_FROM : HELD_OUT_PAIRS_FROM + num_real]
    alone = [clip for clip in clips if not real_speech.is_librivox_sentence(clip)]
    return synthetic + [("real", clip) for clip in joined + alone]


def stream(aligner, samples: np.ndarray, decode_s: float | None, verbose: bool, method: str):
    """Confirmed words with their delays, and each decode's seconds."""
    options, language = TranscriptionOptions(alignment_method=method), None
    buffer, clock, sent, total = RollingBuffer(), 0.0, 0, len(samples) / SAMPLE_RATE
    confirmed, took = [], []

    def arrived(words):
        for word in words:
            end_sent = min(np.ceil(word.end / CHUNK_S) * CHUNK_S, total)
            confirmed.append((word, clock - end_sent))

    while True:
        upto = min(int(round(clock * SAMPLE_RATE)), len(samples))
        if upto > sent:
            buffer.append(samples[sent:upto])
            sent = upto
        if sent >= len(samples) and not buffer.ended:
            buffer.end()
        if not buffer.wants_decode():
            if buffer.ended and not buffer.arrived:
                break
            clock = sent / SAMPLE_RATE + CHUNK_S
            continue
        decode = buffer.next_decode()
        began = time.perf_counter()
        transcript = aligner.run(decode_work(decode, aligner.facts, language, None, options))
        took.append(time.perf_counter() - began)
        clock += took[-1] if decode_s is None else decode_s
        language = language or transcript.language
        update = buffer.take(decode, believed_words(transcript, options))
        arrived(update.confirmed)
        if verbose:
            partial = "".join(w.word for w in update.partial)[:60]
            print(
                f"{clock:6.2f} buffer {len(decode.samples) / SAMPLE_RATE:4.1f} s decode {took[-1]:.2f} s "
                f"confirmed {[w.word for w in update.confirmed]} partial {partial!r}"
            )
    arrived(buffer.finish().confirmed)
    return confirmed, took


def prefixes(aligner, samples: np.ndarray, offline: list, verbose: bool) -> tuple[int, int, int]:
    """Of the offline words, how many the first decode of the audio so far that heard
    ``LAST_WORD_HEARD_AFTER_S`` past each reads otherwise, how many that decode and the next both read
    otherwise (two decodes a policy could agree on), and how many words there are. Greedy only, as a
    live decode (no fallback), and each decode alone (no packing)."""
    cuts = np.arange(STEP_S, len(samples) / SAMPLE_RATE + STEP_S / 2, STEP_S)
    audio_so_far = [samples[: int(cut * SAMPLE_RATE)] for cut in cuts]
    decodes = aligner.transcribe(
        audio_so_far, packing=False, compression_ratio_threshold=None, logprob_threshold=None
    )
    if verbose:
        for cut, decode in zip(cuts, decodes, strict=True):
            print(f"{cut:6.2f} s: {''.join(w.word for w in decode.words)}")
    reference = [plain(w.word) for w in offline]
    paired = [{i for i, _ in align_words(reference, [plain(w.word) for w in d.words])} for d in decodes]
    first = second = 0
    for index, word in enumerate(offline):
        heard_past = [k for k, cut in enumerate(cuts) if cut >= word.end + LAST_WORD_HEARD_AFTER_S][:2]
        misread = [index not in paired[k] for k in heard_past]
        first += misread[0] if misread else 0
        second += all(misread) if len(misread) == 2 else 0
    return first, second, len(offline)


def main_prefixes(aligner, chosen: list[tuple[str, object]], verbose: bool) -> None:
    totals: dict[str, np.ndarray] = {}
    for kind, clip in chosen:
        offline = aligner.transcribe([clip.samples])[0].words
        counts = np.array(prefixes(aligner, clip.samples, offline, verbose))
        print(f"{kind} {clip.duration:.1f} s: misread by one {counts[0]}, two {counts[1]}, of {counts[2]}")
        totals[kind] = totals.get(kind, 0) + counts
    for kind, (first, second, words) in totals.items():
        print(f"{kind}: misread by the first decode {first}/{words}, by it and the next {second}/{words}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=int, default=3, help="joined real-speech recordings (of 20)")
    parser.add_argument("--decode-s", type=float, default=None, help="virtual seconds per decode")
    parser.add_argument("--held-out", action="store_true", help="the recordings the bench does not hold")
    parser.add_argument("--prefixes", action="store_true", help="decode the audio so far; no policy")
    parser.add_argument("--method", default="auto", help="alignment_method, streamed and offline")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    from vllm_whisper_align.runners.offline import WhisperAligner

    rows = []
    with WhisperAligner(None, dtype="float32") as aligner:
        aligner.transcribe([np.zeros(SAMPLE_RATE, dtype=np.float32)])  # warm-up
        chosen = (held_out if args.held_out else recordings)(args.real)
        if args.prefixes:
            return main_prefixes(aligner, chosen, args.verbose)
        for kind, clip in chosen:
            offline = aligner.transcribe([clip.samples], alignment_method=args.method)[0].words
            confirmed, took = stream(aligner, clip.samples, args.decode_s, args.verbose, args.method)
            live = [word for word, _ in confirmed]
            ends = [sum(w.word.rstrip()[-1:] in ".?!" for w in ws) for ws in (live, offline)]
            rows.append(
                {
                    "kind": kind,
                    "delays": [d for _, d in confirmed],
                    "took": took,
                    "ends": ends,
                    "errors": word_errors([plain(w.word) for w in offline], [plain(w.word) for w in live]),
                    "reference": len(offline),
                    "streamed": within(clip, live),
                    "offline": within(clip, offline),
                }
            )
            row = rows[-1]
            print(
                f"{kind} {clip.duration:.1f} s: median delay {np.median(row['delays']):.2f} s, word errors "
                f"{row['errors']}/{row['reference']}, decode median {np.median(took):.2f} s "
                f"max {max(took):.2f} s"
            )
            if args.verbose:
                print("  streamed:", "".join(w.word for w in live))
                print("  offline: ", "".join(w.word for w in offline))
    delays = [d for row in rows for d in row["delays"]]
    took = [t for row in rows for t in row["took"]]
    print(
        f"all: delay median {np.median(delays):.2f} s, p90 {np.percentile(delays, 90):.2f} s; decode median "
        f"{np.median(took):.2f} s, p90 {np.percentile(took, 90):.2f} s"
    )
    print(
        f"WER against offline {sum(r['errors'] for r in rows) / sum(r['reference'] for r in rows):.1%}; "
        f"sentence ends streamed / offline {sum(r['ends'][0] for r in rows)} / "
        f"{sum(r['ends'][1] for r in rows)}"
    )
    for kind in ("synthetic", "real"):
        chosen = [r for r in rows if r["kind"] == kind]
        if chosen:
            share = [
                sum(r[side][0] for r in chosen) / sum(r[side][1] for r in chosen)
                for side in ("streamed", "offline")
            ]
            print(f"starts within 50 ms, {kind}: streamed {share[0]:.1%} / offline {share[1]:.1%}")


if __name__ == "__main__":
    main()
