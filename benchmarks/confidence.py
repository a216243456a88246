"""Word confidence and the ``aligned`` flag, calibrated and checked without the engine in the loop.

    .venv/bin/python benchmarks/confidence.py record [--model tiny.en]   # text that is not in the audio
    .venv/bin/python benchmarks/confidence.py report [--model tiny.en] [--fit]
    .venv/bin/python benchmarks/confidence.py cost [--model tiny.en]     # API-side ms per window

Speech (what the words' starts are judged on) is benchmarks/boundary_replay.py's recording of the
synthetic and real sets (``boundary_replay.py record``, or a copy of it in benchmarks/out/). ``record``
adds what the confidence must call bad and ``aligned`` must call false: each clip's own text forced on
audio that does not hold it (digital silence and white or pink noise of the clip's length), and text
that is not the clip's on the clip (another clip's text, a French, German or Spanish sentence, Lorem
ipsum of the same length), every one a single window, as ``benchmarks/out/confidence-MODEL.pkl``.

``report`` replays both through today's post-processing (``align.results.window_results``) and reads the
evidence ``align.confidence.word_evidence`` gives each word. A word is good when its start is within
``GOOD_WITHIN_S`` of the truth (transcribed words are paired with the spoken words by a minimum edit
distance, substitutions included; a word paired with none is bad); every word of text that is not in the
audio is bad. Splits: *dev* (boundary_replay's dev and pauses sets, the real clips of even index, and
the negatives built on them) calibrates; *held* (held, pauses-held and the negatives on held) and *real*
(the real clips of odd index and theirs) are held out; *real-pauses* (real clips joined by pauses of room
tone) shares recordings with dev. ``--fit`` fits the logistic weights on dev, the negatives weighted to
NEGATIVE_SHARE of speech's words (printed, to paste into align/confidence.py); without it the weights in the
code are scored. Printed per split and kind: AUROC, the words at and above 0.5 and below it (their share
good and their median start error), and the share ``aligned`` false.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import boundary_replay  # noqa: E402

from tests.support.speech import SpokenClip  # noqa: E402

OUT = HERE / "out"
RECORDING_VERSION = 1
# Which boundary_replay sets each split holds, and which of them give the negatives' clips.
SPLITS = {"dev": ("dev", "pauses"), "held": ("held", "pauses-held"), "real": ("real", "real-pauses")}
# (Their clips' speech; sets with pauses left out to keep the recording to minutes on two cores.)
NEGATIVE_SOURCES = ("dev", "held", "real")
# Forced alignments of text that the audio does not hold.
NEGATIVES = ("silence", "noise", "other-text", "foreign", "lorem")
# The weight of text not in the audio in the fit, against speech's.
NEGATIVE_SHARE = 0.3
FOREIGN = [
    "le petit chat dort sur le canapé pendant que la pluie tombe doucement sur la ville",
    "der alte Mann ging langsam über die Brücke und schaute auf den ruhigen Fluss hinunter",
    "mi hermana compró pan fresco y queso en el mercado antes de volver a casa",
    "nous avons mangé une soupe aux légumes avant de partir pour la gare du nord",
    "im Sommer fahren wir oft mit dem Fahrrad zum See und schwimmen bis zum Abend",
    "el viento fuerte movió las hojas secas por toda la calle durante la noche",
]
LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore "
    "et dolore magna aliqua ut enim ad minim veniam quis nostrud exercitation ullamco laboris nisi ut "
    "aliquip ex ea commodo consequat duis aute irure dolor in reprehenderit in voluptate velit esse cillum"
).split()


def recording_path(model: str) -> Path:
    return OUT / f"confidence-{model}.pkl"


def noise(num_samples: int, pink: bool, seed: int) -> np.ndarray:
    """White or pink (1/f power) noise at -30 dBFS RMS."""
    white = np.random.default_rng(seed).normal(0.0, 1.0, num_samples)
    if pink:
        spectrum = np.fft.rfft(white)
        spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
        white = np.fft.irfft(spectrum, num_samples)
    return (0.0316 * white / max(float(white.std()), 1e-12)).astype(np.float32)


def negatives(clips: list[SpokenClip], seed: int) -> dict[str, list[tuple[np.ndarray, str]]]:
    """Per kind of negative, (audio, text) of each clip: audio that does not hold the text."""
    n = len(clips)
    other = [(i + max(1, n // 2)) % n for i in range(n)]  # another clip, never the same one

    def words_like(i: int, pool: list[str]) -> str:
        count = len(clips[i].words)
        return " ".join(pool[(i + k) % len(pool)] for k in range(count))

    return {
        "silence": [(np.zeros(len(c.samples), dtype=np.float32), c.text) for c in clips],
        "noise": [(noise(len(c.samples), i % 2 == 1, seed + i), c.text) for i, c in enumerate(clips)],
        "other-text": [(c.samples, clips[other[i]].text) for i, c in enumerate(clips)],
        "foreign": [(c.samples, FOREIGN[i % len(FOREIGN)]) for i, c in enumerate(clips)],
        "lorem": [(c.samples, words_like(i, LOREM)) for i, c in enumerate(clips)],
    }


def record(out: Path, model: str) -> None:
    from vllm_whisper_align.checkpoints.bundled import resolve_model
    from vllm_whisper_align.runners.offline import WhisperAligner

    sets = boundary_replay.clip_sets()
    recorded: dict = {"version": RECORDING_VERSION, "model": model}
    with (
        WhisperAligner(resolve_model(model), dtype="float32") as aligner,
        boundary_replay.kept_calls() as calls,
    ):
        for index, name in enumerate(NEGATIVE_SOURCES):
            for kind, pairs in negatives(sets[name], seed=1000 * index).items():
                calls.clear()
                audio = [samples for samples, _ in pairs]
                aligner.align(audio, [text for _, text in pairs])
                recorded[(name, kind)] = boundary_replay.in_input_order(calls, audio)
                print(f"{name} {kind}: {len(audio)} alignments", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as file:
        pickle.dump(recorded, file)
    print(f"recorded to {out}")


def replay(recorded: dict, tokens, calls: list[dict]) -> list[list[tuple[object, np.ndarray]]]:
    """Each input's words through today's post-processing, with the evidence each was scored on."""
    from dataclasses import replace

    from vllm_whisper_align.align import confidence, results

    evidence: dict[int, np.ndarray] = {}
    scored = results.set_confidences

    def keep(words, rows, forced):
        evidence.update((id(w), row) for w, row in zip(words, rows, strict=True))
        return scored(words, rows, forced)

    results.set_confidences = keep
    try:
        out = []
        for call in calls:
            windows = [
                replace(w, audio=boundary_replay._at(w.audio, offset))
                for w, offset in zip(call["windows"], call["offsets"], strict=True)
            ]
            answers = results.window_results(windows, call["fetched"], tokens, call["info"])
            words = [w for r in answers if r is not None for w in r.words]
            nothing = np.full(len(confidence.FEATURES), np.nan)
            out.append([(w, evidence.get(id(w), nothing)) for w in words])
    finally:
        results.set_confidences = scored
    return out


def labelled(truth: tuple, words: list[tuple[object, np.ndarray]]) -> list[tuple[np.ndarray, bool, float]]:
    """(evidence, good, start error) per word: paired with a spoken word of the same spelling by minimum
    edit distance, good when its start is within GOOD_WITHIN_S; an unpaired word is bad (error inf); a
    word whose true start is unknown is left out."""
    from tests.support.speech import _plain, align_words
    from vllm_whisper_align.align.confidence import GOOD_WITHIN_S

    spoken, starts = truth[0], truth[1]
    pairs = dict(
        (j, i) for i, j in align_words([_plain(w) for w in spoken], [_plain(w.word) for w, _ in words])
    )
    out = []
    for j, (word, row) in enumerate(words):
        i = pairs.get(j)
        error = np.inf if i is None else abs(word.start - starts[i])
        if np.isnan(error):
            continue
        out.append((row, bool(error <= GOOD_WITHIN_S), float(error)))
    return out


def split_of(source: str, index: int) -> str:
    """dev (fits the weights): the synthetic dev sets, and the real clips of even index; held: the
    held-out synthetic sets; real: the real clips of odd index; real-pauses: the real clips joined by
    pauses (recordings partly seen in dev)."""
    if source in ("dev", "pauses"):
        return "dev"
    if source in ("held", "pauses-held"):
        return "held"
    if source == "real":
        return "dev" if index % 2 == 0 else "real"
    return source


def rows_by_split(model: str) -> dict:
    """{(split, what): [(evidence, good, error)]}, what: forced, transcribed or a kind of negative."""
    speech, tokens = boundary_replay.load(boundary_replay.recording_path(model))
    with open(recording_path(model), "rb") as file:
        negative = pickle.load(file)
    if negative.get("version") != RECORDING_VERSION:
        raise SystemExit("the negatives were recorded by another version of this script: record them again")
    table: dict = {}
    for name in boundary_replay.SETS:
        truths = speech["clips"][name]
        for mode in boundary_replay.MODES:
            for index, words in enumerate(replay(speech, tokens, speech[(name, mode)])):
                key = (split_of(name, index), mode)
                table.setdefault(key, []).extend(labelled(truths[index], words))
    for name in NEGATIVE_SOURCES:
        for kind in NEGATIVES:
            for index, words in enumerate(replay(negative, tokens, negative[(name, kind)])):
                key = (split_of(name, index), kind)
                table.setdefault(key, []).extend((row, False, np.inf) for _, row in words)
    return table


def fit_logistic(
    x: np.ndarray, y: np.ndarray, weight: np.ndarray, l2: float = 1e-2, steps: int = 50
) -> np.ndarray:
    """Weights of a logistic model (each row weighted) by Newton's method, an L2 penalty on all but the
    bias."""
    w = np.zeros(x.shape[1])
    penalty = np.full(x.shape[1], l2)
    penalty[0] = 0.0
    weight = weight / weight.mean()
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -30, 30)))
        gradient = x.T @ (weight * (p - y)) / len(y) + penalty * w
        hessian = (x * (weight * p * (1 - p))[:, None]).T @ x / len(y) + np.diag(penalty)
        w -= np.linalg.solve(hessian + 1e-9 * np.eye(len(w)), gradient)
    return w


def auroc(scores: np.ndarray, good: np.ndarray) -> float:
    """The chance that a good word scores above a bad one (ties count half)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts - 1) / 2.0
    ranks[order] = np.repeat(average, counts) + 1
    n_good, n_bad = good.sum(), (~good).sum()
    if n_good == 0 or n_bad == 0:
        return float("nan")
    return float((ranks[good].sum() - n_good * (n_good + 1) / 2) / (n_good * n_bad))


def describe(rows: list, weights: np.ndarray, aligned_min: float) -> str:
    from vllm_whisper_align.align import confidence

    rows = [r for r in rows if np.isfinite(r[0]).all()]
    if not rows:
        return "no words"
    x = np.array([r[0] for r in rows])
    good = np.array([r[1] for r in rows])
    error = np.array([r[2] for r in rows])
    score = 1.0 / (1.0 + np.exp(-np.clip(x @ weights, -30, 30)))
    high, low = score >= 0.5, score < 0.5
    parts = [f"{len(rows):5d} words, good {100 * good.mean():5.1f}%"]
    if good.any() and (~good).any():
        parts.append(f"AUROC {auroc(score, good):.3f}")
    for name, side in (("conf>=0.5", high), ("conf<0.5", low)):
        if side.any():
            finite = error[side][np.isfinite(error[side])]
            median = f"{1000 * np.median(finite):.0f} ms" if len(finite) else "-"
            parts.append(
                f"{name}: {100 * side.mean():.0f}% of words, {100 * good[side].mean():.0f}% good, "
                f"median start error {median}"
            )
    parts.append(f"aligned false {100 * np.mean(score < aligned_min):.0f}%")
    parts.append(f"mean conf {score.mean():.2f}")
    del confidence
    return "; ".join(parts)


def report(model: str, fit: bool) -> None:
    from vllm_whisper_align.align import confidence

    table = rows_by_split(model)
    weights = confidence.WEIGHTS
    if fit:
        train = [
            (r, what in boundary_replay.MODES)
            for (split, what), rows in table.items()
            if split == "dev"
            for r in rows
            if np.isfinite(r[0]).all()
        ]
        x = np.array([r[0] for r, _ in train])
        y = np.array([r[1] for r, _ in train], dtype=np.float64)
        is_speech = np.array([speech for _, speech in train])
        # Text not in the audio counts NEGATIVE_SHARE of speech in all, however many words it was recorded
        # with: its words are told apart by the window's evidence at any share, and a smaller one leaves
        # the weights to what tells good from bad placements of speech.
        weight = np.where(is_speech, 1.0, NEGATIVE_SHARE * is_speech.sum() / max((~is_speech).sum(), 1))
        weights = fit_logistic(x, y, weight)
        print("WEIGHTS = np.array([" + ", ".join(f"{w:.3f}" for w in weights) + "])")
        print(
            "  (" + ", ".join(f"{n}={w:.3f}" for n, w in zip(confidence.FEATURES, weights, strict=True)) + ")"
        )
    threshold = confidence.ALIGNED_MIN_CONFIDENCE
    for split in ("dev", "held", "real", "real-pauses"):
        for what in (*boundary_replay.MODES, *NEGATIVES):
            rows = table.get((split, what))
            if rows:
                print(f"{split:11} {what:12} {describe(rows, weights, threshold)}")
        speech = [r for what in boundary_replay.MODES for r in table.get((split, what), [])]
        every = [r for (name, _), rows in table.items() if name == split for r in rows]
        print(f"{split:11} {'speech':12} {describe(speech, weights, threshold)}")
        print(f"{split:11} {'all':12} {describe(every, weights, threshold)}")


def cost(model: str, rounds: int = 3) -> None:
    """API-side milliseconds per window of ``window_results`` on the held-out sets (forced and
    transcribed), with the confidence and without it (its evidence not read), medians of ``rounds``."""
    import time

    from vllm_whisper_align.align import results

    speech, tokens = boundary_replay.load(boundary_replay.recording_path(model))
    calls = [
        c for name in ("held", "pauses-held") for mode in boundary_replay.MODES for c in speech[(name, mode)]
    ]
    num_windows = sum(len(c["windows"]) for c in calls)
    evidence, scored = results.word_evidence, results.set_confidences
    timings: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(rounds):
        for variant in ("with", "without"):
            if variant == "without":
                results.word_evidence = lambda words, *_: np.zeros((len(words), 1))
                results.set_confidences = lambda *_: None
            begin = time.perf_counter()
            replay(speech, tokens, calls)
            timings[variant].append((time.perf_counter() - begin) / num_windows)
            results.word_evidence, results.set_confidences = evidence, scored
    for variant, values in timings.items():
        median = 1000 * float(np.median(values))
        print(f"{variant} confidence: {median:.1f} ms per window ({num_windows} windows)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["record", "report", "cost"])
    parser.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    parser.add_argument(
        "--fit", action="store_true", help="fit the weights on dev instead of scoring the code's"
    )
    args = parser.parse_args()
    if args.action == "record":
        record(recording_path(args.model), args.model)
    elif args.action == "cost":
        cost(args.model)
    else:
        report(args.model, args.fit)


if __name__ == "__main__":
    main()
