"""Accuracy against the known word boundaries, and agreement with the openai-whisper reference.

Spoken and heard words are paired like tests/speech.py's `start_errors`: a minimum edit-distance
alignment (`speech.align_words`) of lowercased, punctuation-stripped words, so a repeated word or
phrase pairs with the right occurrence (the nearest in time where the counts differ). Words the
transcript lacks (or spells differently) stay unpaired and count as misses in the "within X ms"
shares, which are over ALL spoken words; the mean absolute errors are over paired words only. Words
whose true start is unknown (continuous speech: a word libespeak-ng spoke together with its
neighbour) are left out of every figure.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support
from tests.support.speech import align_words  # noqa: E402

THRESHOLDS_MS = (50, 100, 200)
AGREEMENT_MS = (20, 100)
_STRIP = re.compile(r"^[\W_]+|[\W_]+$", re.UNICODE)


def normalise(word: str) -> str:
    return _STRIP.sub("", word.strip()).lower()


def match_words(
    spoken: Sequence[str], heard: Sequence[dict], spoken_starts: Sequence[float]
) -> list[tuple[int, int]]:
    """(spoken index, heard index) pairs of the same word, in order (a word said more often than
    heard pairs with the occurrence nearest in time)."""
    a = [normalise(w) for w in spoken]
    b = [normalise(w["word"]) for w in heard]
    return [(i, j) for i, j in align_words(a, b, spoken_starts, [w["start"] for w in heard]) if a[i]]


def file_errors(truth: dict, words: Sequence[dict]) -> dict[str, np.ndarray]:
    """Per spoken word: signed start and end error (s), NaN where the word was not heard."""
    n = len(truth["words"])
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    heard = [w for w in words if w.get("start") is not None]
    for i, j in match_words(truth["words"], heard, truth["starts"]):
        start[i] = heard[j]["start"] - truth["starts"][i]
        if heard[j].get("end") is not None:
            end[i] = heard[j]["end"] - truth["ends"][i]
    return {"start": start, "end": end}


SPEECH_KINDS = ("pauses", "continuous")


def accuracy(truth: dict[str, dict], files: dict[str, dict]) -> dict[str, Any]:
    """Pooled over every spoken word (with a known start) of the files this run transcribed."""
    starts, ends = [], []
    for clip_id, result in files.items():
        errors = file_errors(truth[clip_id], result.get("words") or [])
        known = ~np.isnan(np.asarray(truth[clip_id]["starts"], dtype=float))
        starts.append(errors["start"][known])
        ends.append(errors["end"][known])
    if not starts:
        return {}
    signed = np.concatenate(starts)
    start = np.abs(signed)
    end = np.abs(np.concatenate(ends))
    matched = ~np.isnan(start)
    out: dict[str, Any] = {
        "words_spoken": int(start.size),
        "words_matched_pct": _pct(matched.mean()),
        "start_mae_ms": _ms(np.nanmean(start)) if matched.any() else None,
        "end_mae_ms": _ms(np.nanmean(end)) if (~np.isnan(end)).any() else None,
        "start_median_ms": _ms(np.nanmedian(start)) if matched.any() else None,
        "start_bias_ms": _ms(np.nanmedian(signed)) if matched.any() else None,  # median heard - true
    }
    for ms in THRESHOLDS_MS:
        out[f"start_within_{ms}ms_pct"] = _pct(np.mean(np.nan_to_num(start, nan=np.inf) <= ms / 1000))
        if matched.any():
            out[f"heard_within_{ms}ms_pct"] = _pct(np.mean(start[matched] <= ms / 1000))
    return out


def accuracy_by_speech(truth: dict[str, dict], files: dict[str, dict]) -> dict[str, Any]:
    """``accuracy`` of the files of each kind of speech (truth's ``speech``), keys prefixed by the kind."""
    out: dict[str, Any] = {}
    for kind in SPEECH_KINDS:
        subset = {i: r for i, r in files.items() if truth[i].get("speech", "pauses") == kind}
        out.update({f"{kind}_{key}": value for key, value in accuracy(truth, subset).items()})
    return out


def start_error_list(truth: dict[str, dict], files: dict[str, dict]) -> list[float]:
    """|start error| in ms of every paired word (for the distribution plot) — misses excluded."""
    values = []
    for clip_id, result in files.items():
        e = file_errors(truth[clip_id], result.get("words") or [])["start"]
        values += [round(abs(x) * 1000, 2) for x in e if not math.isnan(x)]
    return values


def agreement(truth: dict[str, dict], files: dict[str, dict], reference: dict[str, dict]) -> dict[str, Any]:
    """Share of spoken words, heard by both this run and the reference, whose starts agree within X ms."""
    diffs = []
    for clip_id, result in files.items():
        if clip_id not in reference:
            continue
        ours = file_errors(truth[clip_id], result.get("words") or [])["start"]
        ref = file_errors(truth[clip_id], reference[clip_id].get("words") or [])["start"]
        both = ~np.isnan(ours) & ~np.isnan(ref)
        diffs.append(np.abs(ours[both] - ref[both]))  # errors share the truth, so this is |ours - ref|
    if not diffs:
        return {}
    d = np.concatenate(diffs)
    out: dict[str, Any] = {"ref_words_compared": int(d.size)}
    for ms in AGREEMENT_MS:
        out[f"ref_agree_{ms}ms_pct"] = _pct(np.mean(d <= ms / 1000 + 1e-9)) if d.size else None
    return out


def _ms(seconds: float) -> float:
    return round(float(seconds) * 1000, 1)


def _pct(share: float) -> float:
    return round(float(share) * 100, 1)


def drift(truth: dict, words: Sequence[dict], span_s: float = 60.0) -> dict[str, Any]:
    """Start MAE of the words whose true start lies in the first and in the last `span_s` of a recording:
    an alignment that drifts gets worse towards the end."""
    start = np.abs(file_errors(truth, words)["start"])
    true = np.asarray(truth["starts"], dtype=float)
    out: dict[str, Any] = {}
    for name, inside in (("first", true < span_s), ("last", true >= truth["duration"] - span_s)):
        paired = inside & ~np.isnan(start)  # NaN true starts are never inside
        out[f"{name}_minute_start_mae_ms"] = _ms(start[paired].mean()) if paired.any() else None
    return out


def longform_accuracy(truth: dict, words: Sequence[dict]) -> dict[str, Any]:
    """``accuracy`` of one long recording, with its drift (first vs last minute)."""
    return {**accuracy({"recording": truth}, {"recording": {"words": words}}), **drift(truth, words)}
