"""The worker-side store's bookkeeping on hand-made steps (no engine: tests/test_engine.py covers the
same paths through a real one). Steps are built with the fields of vLLM's SchedulerOutput the store
reads (vllm_internals.SCHEDULER_OUTPUT_FIELDS)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_whisper_align.engine.capture import AlignmentCapture
from vllm_whisper_align.engine.vllm_internals import SCHEDULER_OUTPUT_FIELDS
from vllm_whisper_align.protocol import AlignmentParams, AlignmentRequest, NoSpeechParams

HEAD_DIM, ENCODER_ROWS, MAX_ROWS = 4, 6, 16


def make_capture(**options) -> AlignmentCapture:
    layer = SimpleNamespace(
        capture_heads=[0],
        captured_q=torch.zeros((32, 1, HEAD_DIM)),
        captured_k=torch.zeros((2 * ENCODER_ROWS, 1, HEAD_DIM)),
    )
    return AlignmentCapture([layer], HEAD_DIM, MAX_ROWS, ENCODER_ROWS, max_requests=2, **options)


def step(new=(), cached=(), finished=(), encoder=()) -> SimpleNamespace:
    """new: (req_id, params, tokens) admitted now; cached: (req_id, computed, tokens) running on.
    params: AlignmentParams, NoSpeechParams, a tuple of both, or None."""

    def extra_args(params):
        merged = None
        for p in params if isinstance(params, tuple) else (params,):
            merged = p.to_extra_args(merged) if p else merged
        return merged

    new_reqs = [
        SimpleNamespace(
            req_id=r, num_computed_tokens=0, sampling_params=SimpleNamespace(extra_args=extra_args(p))
        )
        for r, p, _ in new
    ]
    scheduled = {r: n for r, _, n in new} | {r: n for r, _, n in cached}
    output = SimpleNamespace(
        scheduled_new_reqs=new_reqs,
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[r for r, _, _ in cached], num_computed_tokens=[c for _, c, _ in cached]
        ),
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_encoder_inputs={r: [0] for r in encoder},
        finished_req_ids=set(finished),
    )
    assert set(vars(output)) == set(SCHEDULER_OUTPUT_FIELDS)
    return output


def run_request(capture: AlignmentCapture, req_id: str, params: AlignmentParams, text_tokens: int) -> None:
    prompt = params.text_row + 1
    capture.after_step(step(new=[(req_id, params, prompt)], encoder=[req_id]), [req_id])
    for i in range(text_tokens):
        capture.after_step(step(cached=[(req_id, prompt + i, 1)]), [req_id])


def test_fetch_returns_the_rows_sent_and_frees_everything():
    capture = make_capture()
    params = AlignmentParams.for_prompt(num_frames=8, num_previous=1, num_start=2)
    run_request(capture, "r1", params, text_tokens=3)
    capture.after_step(step(finished=["r1"]), [])
    [answer] = capture.fetch([AlignmentRequest(params.key, num_text_tokens=3)])
    # heads x [sot, no_timestamps, 3 text rows] (the eot row was never fed) x num_frames // 2
    assert answer["shape"] == [1, min(params.rows_sent(3), 1 + 1 + 3), 4], answer
    assert capture.stats() | {"slot_bytes": 0, "slot_resident_bytes": 0} == {
        "tracked": 0,
        "parked": 0,
        "slots": 4,
        "free_slots": 4,
        "slot_bytes": 0,
        "slot_resident_bytes": 0,
        "parked_bytes": 0,
        "no_speech_pending": 0,
        "no_speech_parked": 0,
        "most_encoder_inputs_per_step": 1,
    }


def test_unfetched_results_expire_after_the_ttl():
    capture = make_capture(result_ttl_s=0.05)
    params = AlignmentParams.for_prompt(num_frames=8, num_previous=0, num_start=2)
    run_request(capture, "r1", params, text_tokens=2)
    capture.after_step(step(finished=["r1"]), [])
    assert capture.stats()["parked"] == 1
    time.sleep(0.1)
    assert capture.stats()["parked"] == 0
    [answer] = capture.fetch([AlignmentRequest(params.key, 2)])
    assert "error" in answer


def test_discard_frees_a_live_request_and_a_parked_one():
    capture = make_capture()
    live, parked = (AlignmentParams.for_prompt(8, 0, 2) for _ in range(2))
    run_request(capture, "live", live, text_tokens=1)
    run_request(capture, "done", parked, text_tokens=1)
    capture.after_step(step(finished=["done"]), [])
    assert capture.discard([live.key, parked.key]) == 2
    stats = capture.stats()
    assert stats["tracked"] == 0 and stats["parked"] == 0 and stats["free_slots"] == stats["slots"]


def test_slot_pages_go_back_only_when_no_request_holds_one():
    """An idle engine hands the pool's pages back (stats count what stays resident); never while a
    request's rows are in it."""
    rows = 4096  # slots big enough to span whole pages
    layer = SimpleNamespace(
        capture_heads=[0], captured_q=torch.zeros((32, 1, 64)), captured_k=torch.ones((2 * rows, 1, 64))
    )
    capture = AlignmentCapture([layer], 64, MAX_ROWS, rows, max_requests=2)
    params = AlignmentParams.for_prompt(num_frames=8, num_previous=0, num_start=2)
    run_request(capture, "r1", params, text_tokens=2)
    assert capture.stats()["slot_resident_bytes"] > 0
    assert capture.release_slot_pages() == 0  # r1 still holds its slot
    capture.after_step(step(finished=["r1"]), [])
    assert capture.release_slot_pages() > 0.9 * capture.stats()["slot_bytes"]
    assert capture.stats()["slot_resident_bytes"] == 0
    [answer] = capture.fetch([AlignmentRequest(params.key, num_text_tokens=2)])
    assert "error" not in answer  # r1's result was formed before its slot went back
    second = AlignmentParams.for_prompt(num_frames=8, num_previous=0, num_start=2)
    run_request(capture, "r2", second, text_tokens=2)  # on the fresh zero pages
    capture.after_step(step(finished=["r2"]), [])
    [answer] = capture.fetch([AlignmentRequest(second.key, num_text_tokens=2)])
    assert np.frombuffer(answer["cross_qk"], np.float32).size > 0


def test_queries_land_in_their_own_requests_rows():
    """Two requests in one step: each one's captured query rows are its own, at its positions."""
    capture = make_capture()
    a, b = AlignmentParams.for_prompt(8, 0, 2), AlignmentParams.for_prompt(8, 0, 2)
    layer = capture.layers[0]
    layer.captured_q[:4] = torch.arange(4, dtype=torch.float32).view(4, 1, 1).expand(4, 1, HEAD_DIM)
    layer.captured_k[: 2 * ENCODER_ROWS] = 1.0
    capture.after_step(step(new=[("a", a, 2), ("b", b, 2)], encoder=["a", "b"]), ["b", "a"])
    capture.after_step(step(finished=["a", "b"]), [])
    answers = {r["key"]: r for r in capture.fetch([AlignmentRequest(a.key, 0), AlignmentRequest(b.key, 0)])}
    qk_a = np.frombuffer(answers[a.key]["cross_qk"], np.float32).reshape(answers[a.key]["shape"])
    qk_b = np.frombuffer(answers[b.key]["cross_qk"], np.float32).reshape(answers[b.key]["shape"])
    scale = HEAD_DIM * HEAD_DIM**-0.5  # q row value v gives q.k = v * HEAD_DIM, scaled by 1/sqrt(d)
    np.testing.assert_allclose(qk_b[0, :, 0], np.array([0, 1]) * scale)  # b's tokens came first
    np.testing.assert_allclose(qk_a[0, :, 0], np.array([2, 3]) * scale)


def test_no_speech_prob_is_read_at_each_requests_sot_row():
    """Two requests in one step, in batch order b, a: each gets softmax(logits of its own sot row)
    at the no-speech token; a's sot row comes after two <|startofprev|> rows. Nothing stays kept."""
    vocab, width = 5, 3
    lm_head = torch.randn(vocab, width, generator=torch.Generator().manual_seed(0))
    hidden = torch.randn(8, width, generator=torch.Generator().manual_seed(1))
    capture = make_capture(hidden=hidden.clone(), logits_of=lambda rows: rows @ lm_head.T)
    a, b = NoSpeechParams(row=2, token=4), NoSpeechParams(row=0, token=4)
    a_alignment = AlignmentParams(8, 2, 3)
    capture.after_step(step(new=[("a", (a_alignment, a), 4), ("b", b, 2)]), ["b", "a"])
    expected = (hidden @ lm_head.T).softmax(-1)[:, 4]
    answers = {r["key"]: r for r in capture.no_speech_probs([a.key, b.key, "unknown"])}
    assert answers[b.key]["no_speech_prob"] == pytest.approx(float(expected[0]))  # b: rows 0-1, sot at 0
    assert answers[a.key]["no_speech_prob"] == pytest.approx(float(expected[2 + 2]))  # a: rows 2-5, sot at 4
    assert "error" in answers["unknown"]
    capture.after_step(step(finished=["a", "b"]), [])
    capture.discard([a_alignment.key])
    stats = capture.stats()
    assert stats["no_speech_pending"] == stats["no_speech_parked"] == stats["parked"] == 0, stats


def test_no_speech_of_an_aborted_request_is_forgotten():
    capture = make_capture(hidden=torch.zeros(8, 3), logits_of=lambda rows: rows)
    params = NoSpeechParams(row=3, token=0)
    capture.after_step(step(new=[("r", params, 2)]), ["r"])  # a chunked prompt: sot row not reached
    assert capture.stats()["no_speech_pending"] == 1
    capture.after_step(step(finished=["r"]), [])
    assert capture.stats()["no_speech_pending"] == 0
