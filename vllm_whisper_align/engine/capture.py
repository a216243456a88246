"""Worker side: attributes each step's captured rows to requests and answers the fetch RPC.

After every model step the plugin calls :meth:`AlignmentCapture.after_step`. The step's flattened
tokens are split per request in the runner's batch order (V1 runner: ``input_batch.req_ids``; runner
V2: ``execute_model_state.input_batch.req_ids``) with ``scheduler_output.num_scheduled_tokens``; a
token's decoder position is the request's ``num_computed_tokens`` plus its index in the step. Encoder
keys belong, 1500 rows each, to the requests of ``scheduler_output.scheduled_encoder_inputs`` in
that dict's order, which is the order the runner concatenates encoder outputs in.

Only requests whose ``SamplingParams.extra_args`` carry :class:`AlignmentParams` get a slot; their
rows are gathered with one ``index_copy_`` per alignment layer and step. When a request finishes
(or is aborted) its Q·Kᵀ is formed, moved to host memory and its slot is freed; the host copy waits
for the fetch RPC, bounded in count and age.

Requests whose ``extra_args`` carry :class:`NoSpeechParams` get openai-whisper's ``no_speech_prob``:
the model keeps each step's decoder output (``hidden``), and the step that computes a request's
``<|startoftranscript|>`` row turns that one row into logits; the probability waits for its RPC
like a parked matrix.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from vllm_whisper_align import memory
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.protocol import (
    MAX_PARKED,
    RESULT_TTL_S,
    AlignmentParams,
    AlignmentRequest,
    NoSpeechParams,
)

logger = get_logger(__name__)


class CapturingLayer(Protocol):
    """What the store needs of a decoder layer's cross-attention (``capture_cross_attention``)."""

    capture_heads: list[int]
    captured_q: torch.Tensor  # [max_tokens, len(capture_heads), head_dim]: this step's queries
    captured_k: torch.Tensor  # [max_encoder_rows, len(capture_heads), head_dim]: this step's keys


@dataclass
class _Tracked:
    params: AlignmentParams
    slot: int
    num_rows: int = 0  # decoder rows captured so far (highest position + 1)
    has_keys: bool = False


@dataclass
class _Parked:
    params: AlignmentParams
    qk: np.ndarray | None  # [heads, rows from sot_row, real encoder frames] float32
    parked_at: float
    error: str | None = None


class AlignmentCapture:
    """Per-request storage of the alignment heads' queries and keys, in slots that grow on demand."""

    def __init__(
        self,
        layers: list[CapturingLayer],
        head_dim: int,
        max_decoder_rows: int,
        encoder_rows: int,
        max_requests: int,
        result_ttl_s: float = RESULT_TTL_S,
        max_parked: int = MAX_PARKED,
        hidden: torch.Tensor | None = None,
        logits_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
        tuned_heads: tuple[int, ...] | None = None,
        candidate_heads: tuple[int, ...] | None = None,
    ):
        self.layers = layers
        # Which captured heads (indices in capture order) the fixed and the selected ways read;
        # they travel with every result so the caller needs no copy of the model's head list.
        num_captured = sum(len(layer.capture_heads) for layer in layers)
        self.tuned_heads = list(range(num_captured) if tuned_heads is None else tuned_heads)
        self.candidate_heads = list(range(num_captured) if candidate_heads is None else candidate_heads)
        # This step's decoder output [max_tokens, d_model] and the model's LM head, for no_speech_prob.
        self.hidden = hidden
        self.logits_of = logits_of
        self.no_speech_pending: dict[str, NoSpeechParams] = {}  # by engine request id
        self.no_speech_parked: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key: (prob, time)
        self.result_ttl_s = result_ttl_s
        self.max_parked = max_parked
        self.head_dim = head_dim
        self.max_decoder_rows = max_decoder_rows
        self.encoder_rows = encoder_rows
        self.max_requests = max_requests
        self.num_heads = sum(len(layer.capture_heads) for layer in layers)
        self.tracked: dict[str, _Tracked] = {}  # by engine request id
        self.parked: OrderedDict[str, _Parked] = OrderedDict()  # by alignment key
        self.free_slots: list[int] = []
        self.q_slots: list[torch.Tensor] = []  # per layer: [slots * max_decoder_rows, heads, head_dim]
        self.k_slots: list[torch.Tensor] = []  # per layer: [slots, encoder_rows, heads, head_dim]
        self.num_slots = 0
        # The most encoder inputs one step has started (settings.encoder_rows_per_step).
        self.most_encoder_inputs_per_step = 0

    # ---- slots -------------------------------------------------------------------------------

    def _grow(self) -> bool:
        # A finished request holds its slot until the next step reports it, while that step may
        # already admit its successor: max_num_seqs + 1 can be alive at once. Twice max_num_seqs is
        # headroom; the pool only grows as far as it is used.
        new_slots = min(2 * self.max_requests, max(4, 2 * self.num_slots))
        if new_slots <= self.num_slots:
            return False
        q_slots, k_slots = [], []
        for index, layer in enumerate(self.layers):
            like = layer.captured_q
            heads = like.shape[1]
            q = like.new_zeros((new_slots * self.max_decoder_rows, heads, self.head_dim))
            k = like.new_zeros((new_slots, self.encoder_rows, heads, self.head_dim))
            if self.num_slots:
                q[: self.num_slots * self.max_decoder_rows] = self.q_slots[index]
                k[: self.num_slots] = self.k_slots[index]
            q_slots.append(q)
            k_slots.append(k)
        self.q_slots, self.k_slots = q_slots, k_slots
        self.free_slots.extend(range(new_slots - 1, self.num_slots - 1, -1))
        self.num_slots = new_slots
        return True

    def release_slot_pages(self) -> int:
        """With no request holding a slot, hand the pool's pages back to the OS (host memory only).

        The pool keeps its size, and a slot's rows are always written before they are read, so the
        zero pages the next request finds serve as well as the old ones. Returns the bytes handed back.
        """
        if self.tracked:
            return 0
        return sum(memory.release_pages(*buffer) for buffer in self._host_buffers())

    def _host_buffers(self) -> list[tuple[int, int]]:
        """``(address, nbytes)`` of each slot tensor in host memory (none on GPU)."""
        return [
            (t.data_ptr(), t.numel() * t.element_size())
            for t in self.q_slots + self.k_slots
            if t.device.type == "cpu"
        ]

    def _take_slot(self) -> int | None:
        if not self.free_slots and not self._grow():
            return None
        return self.free_slots.pop()

    # ---- per step ----------------------------------------------------------------------------

    def after_step(self, scheduler_output: Any, batch_req_ids: list[str]) -> None:
        # Requests reported finished ended in an earlier step: their rows are complete, and their
        # slots must be free before this step's new requests take one.
        for req_id in scheduler_output.finished_req_ids:
            if req_id in self.tracked:
                self._park(req_id)
            self.no_speech_pending.pop(req_id, None)  # aborted before its prompt ran
        self._track_new_requests(scheduler_output)
        self.most_encoder_inputs_per_step = max(
            self.most_encoder_inputs_per_step, len(scheduler_output.scheduled_encoder_inputs)
        )
        if self.tracked and scheduler_output.total_num_scheduled_tokens:
            self._copy_keys(scheduler_output)
            self._copy_queries(scheduler_output, batch_req_ids)
        if self.no_speech_pending and scheduler_output.total_num_scheduled_tokens:
            self._read_no_speech(scheduler_output, batch_req_ids)
        self._expire_parked()

    def _track_new_requests(self, scheduler_output: Any) -> None:
        for new_request in scheduler_output.scheduled_new_reqs:
            sampling_params = new_request.sampling_params
            extra_args = sampling_params and sampling_params.extra_args
            no_speech = NoSpeechParams.from_extra_args(extra_args)
            if no_speech is not None and self.hidden is not None:
                self.no_speech_pending[new_request.req_id] = no_speech
            params = AlignmentParams.from_extra_args(extra_args)
            if params is None or new_request.req_id in self.tracked:
                continue
            slot = self._take_slot()
            if slot is None:
                # Never raise here: an exception in the step hook kills the engine for everyone.
                logger.error(
                    "No free capture slot for request %s; it gets no word timings", new_request.req_id
                )
                self.parked[params.key] = _Parked(params, None, time.monotonic(), "no free capture slot")
                continue
            self.tracked[new_request.req_id] = _Tracked(params, slot)

    def _copy_keys(self, scheduler_output: Any) -> None:
        row = 0
        for req_id in scheduler_output.scheduled_encoder_inputs:
            entry = self.tracked.get(req_id)
            if entry is not None:
                for layer, k_slots in zip(self.layers, self.k_slots, strict=True):
                    k_slots[entry.slot].copy_(layer.captured_k[row : row + self.encoder_rows])
                entry.has_keys = True
            row += self.encoder_rows

    def _copy_queries(self, scheduler_output: Any, batch_req_ids: list[str]) -> None:
        sources, targets = [], []
        for req_id, row, first, count in _step_rows(scheduler_output, batch_req_ids):
            entry = self.tracked.get(req_id)
            if entry is not None:
                first = entry.num_rows if first is None else first
                positions = np.arange(first, min(first + count, self.max_decoder_rows))
                sources.append(np.arange(row, row + len(positions)))
                targets.append(entry.slot * self.max_decoder_rows + positions)
                entry.num_rows = max(entry.num_rows, first + len(positions))
        if not sources:
            return
        device = self.q_slots[0].device
        source_rows = torch.from_numpy(np.concatenate(sources)).to(device, non_blocking=True)
        target_rows = torch.from_numpy(np.concatenate(targets)).to(device, non_blocking=True)
        for layer, q_slots in zip(self.layers, self.q_slots, strict=True):
            q_slots.index_copy_(0, target_rows, layer.captured_q.index_select(0, source_rows))

    def _read_no_speech(self, scheduler_output: Any, batch_req_ids: list[str]) -> None:
        """openai-whisper's ``probs_at_sot[no_speech]`` for requests whose sot row ran in this step."""
        rows, done = [], []
        for req_id, row, first, count in _step_rows(scheduler_output, batch_req_ids):
            params = self.no_speech_pending.get(req_id)
            if params is not None and first is not None and first <= params.row < first + count:
                rows.append(row + params.row - first)
                done.append(params)
                del self.no_speech_pending[req_id]
        if not rows:
            return
        index = torch.tensor(rows, device=self.hidden.device)
        logits = self.logits_of(self.hidden.index_select(0, index)).float()
        tokens = torch.tensor([p.token for p in done], device=logits.device)
        probs = logits.softmax(dim=-1).gather(1, tokens[:, None])[:, 0].tolist()
        now = time.monotonic()
        for params, prob in zip(done, probs, strict=True):
            self.no_speech_parked[params.key] = (prob, now)

    # ---- results -----------------------------------------------------------------------------

    def _cross_qk(self, entry: _Tracked) -> np.ndarray:
        """Scaled Q·Kᵀ of the alignment heads: [heads, rows from sot_row, real encoder frames]."""
        params = entry.params
        frames = min(params.num_frames // 2, self.encoder_rows)
        base = entry.slot * self.max_decoder_rows
        per_layer = []
        for q_slots, k_slots in zip(self.q_slots, self.k_slots, strict=True):
            q = q_slots[base + params.sot_row : base + entry.num_rows].float()
            k = k_slots[entry.slot, :frames].float()
            per_layer.append(torch.einsum("rhd,fhd->hrf", q, k))
        qk = torch.cat(per_layer) * self.head_dim**-0.5
        return qk.cpu().numpy()

    def _park(self, req_id: str) -> None:
        entry = self.tracked.pop(req_id)
        error = None
        qk = None
        if not entry.has_keys or not entry.params.has_text_rows(entry.num_rows):
            error = "the request produced no decoder rows to align"
        else:
            qk = self._cross_qk(entry)
        self.free_slots.append(entry.slot)
        self.parked[entry.params.key] = _Parked(entry.params, qk, time.monotonic(), error)
        self.parked.move_to_end(entry.params.key)

    def fail_all(self, error: str) -> None:
        """Give every tracked request an error result and free all slots."""
        now = time.monotonic()
        for entry in self.tracked.values():
            self.parked[entry.params.key] = _Parked(entry.params, None, now, error)
        self.tracked.clear()
        self.no_speech_pending.clear()
        self.free_slots = list(range(self.num_slots - 1, -1, -1))

    def _expire_parked(self) -> None:
        now = time.monotonic()
        while self.parked:
            key, oldest = next(iter(self.parked.items()))
            if len(self.parked) <= self.max_parked and now - oldest.parked_at < self.result_ttl_s:
                break
            logger.warning("Dropping word timings of request %s: not fetched in time", key)
            del self.parked[key]
        while self.no_speech_parked:
            key, (_, parked_at) = next(iter(self.no_speech_parked.items()))
            if len(self.no_speech_parked) <= self.max_parked and now - parked_at < self.result_ttl_s:
                break
            del self.no_speech_parked[key]

    def fetch(self, requests: list[AlignmentRequest]) -> list[dict[str, Any]]:
        """Cross-attention logits of finished requests; frees everything kept for them.

        The normalisation and DTW run on the caller's side, off the engine's step loop.

        A request may be fetched before the worker has seen it finish (the client gets its tokens
        first), so live requests are parked on the spot.
        """
        by_key = {entry.params.key: req_id for req_id, entry in self.tracked.items()}
        results = []
        for request in requests:
            if request.key in by_key:
                self._park(by_key[request.key])
            parked = self.parked.pop(request.key, None)
            results.append(_qk_result(parked, request, self.tuned_heads, self.candidate_heads))
        return results

    def no_speech_probs(self, keys: list[str]) -> list[dict[str, Any]]:
        """``no_speech_prob`` of requests whose prompt has run; frees what was kept for them."""
        results = []
        for key in keys:
            parked = self.no_speech_parked.pop(key, None)
            if parked is None:
                results.append(
                    {
                        "key": key,
                        "error": "no no_speech_prob for this request (expired, never "
                        "asked for, or served by another engine)",
                    }
                )
            else:
                results.append({"key": key, "no_speech_prob": parked[0]})
        return results

    def discard(self, keys: list[str]) -> int:
        """Forgets aborted requests' captures; the slot of a live one is freed when it finishes."""
        dropped = 0
        for key in keys:
            dropped += self.parked.pop(key, None) is not None
            dropped += self.no_speech_parked.pop(key, None) is not None
        for req_id, params in list(self.no_speech_pending.items()):
            if params.key in keys:
                dropped += self.no_speech_pending.pop(req_id) is not None
        for req_id, entry in list(self.tracked.items()):
            if entry.params.key in keys:
                self.tracked.pop(req_id)
                self.free_slots.append(entry.slot)
                dropped += 1
        return dropped

    def stats(self) -> dict[str, int]:
        self._expire_parked()
        return {
            "tracked": len(self.tracked),
            "parked": len(self.parked),
            "slots": self.num_slots,
            "free_slots": len(self.free_slots),
            "slot_bytes": sum(t.numel() * t.element_size() for t in self.q_slots + self.k_slots),
            "slot_resident_bytes": sum(memory.resident_bytes(*buffer) for buffer in self._host_buffers()),
            "parked_bytes": sum(p.qk.nbytes for p in self.parked.values() if p.qk is not None),
            "no_speech_pending": len(self.no_speech_pending),
            "no_speech_parked": len(self.no_speech_parked),
            "most_encoder_inputs_per_step": self.most_encoder_inputs_per_step,
        }


def _step_rows(scheduler_output: Any, batch_req_ids: list[str]) -> Iterator[tuple[str, int, int | None, int]]:
    """Per request of the step: its first row in the flattened tokens, its first decoder position
    (None when the scheduler did not say) and its number of tokens."""
    computed = _num_computed_tokens(scheduler_output)
    num_scheduled = scheduler_output.num_scheduled_tokens
    row = 0
    for req_id in batch_req_ids:
        count = num_scheduled.get(req_id, 0)
        if count:
            yield req_id, row, computed.get(req_id), count
        row += count


def _num_computed_tokens(scheduler_output: Any) -> dict[str, int]:
    computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    return computed


def _qk_result(
    parked: _Parked | None, request: AlignmentRequest, tuned: list[int], candidates: list[int]
) -> dict[str, Any]:
    if parked is None:
        return {
            "key": request.key,
            "error": "no alignment captured for this request (expired, "
            "never asked for, or served by another engine)",
        }
    if parked.error is not None:
        return {"key": request.key, "error": parked.error}
    # Rows past the eot row (a step the engine ran after the request finished) are not sent.
    rows = min(parked.qk.shape[1], parked.params.rows_sent(request.num_text_tokens))
    cross_qk = np.ascontiguousarray(parked.qk[:, :rows], dtype=np.float32)
    # Raw bytes: the RPC's msgpack encoder would turn an ndarray into nested lists.
    return {
        "key": request.key,
        "cross_qk": cross_qk.tobytes(),
        "shape": list(cross_qk.shape),
        "tuned_heads": tuned,
        "candidate_heads": candidates,
    }
