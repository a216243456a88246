"""vLLM's Whisper with the alignment heads' cross-attention kept from the decoding forward.

The forward only copies the alignment heads' cross-attention queries (every step) and keys (the step
that feeds a request's encoder output) into buffers allocated once at load time (the layers are swapped
by :func:`~vllm_whisper_align.engine.vllm_internals.capture_cross_attention`). Nothing in the forward
depends on which requests are running, so it stays valid under ``torch.compile`` and CUDA graphs; rows
are attributed to requests after the step by :mod:`vllm_whisper_align.engine.capture`, which also forms
Q·Kᵀ for the requests that asked for it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.inputs import TextPrompt
from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

from vllm_whisper_align.engine import vllm_internals
from vllm_whisper_align.engine.capture import AlignmentCapture
from vllm_whisper_align.engine.encoder_cache import EncoderOutputCache, encode_with_cache
from vllm_whisper_align.engine.heads import captured_heads, resolve_alignment_heads
from vllm_whisper_align.engine.int8 import encoder_int8_supported, quantize_encoder_linears
from vllm_whisper_align.engine.settings import encoder_rows_per_step
from vllm_whisper_align.log import get_logger
from vllm_whisper_align.protocol import WhisperAlignConfig
from vllm_whisper_align.tokens import ENGLISH_ONLY_START, is_english_only_vocab

logger = get_logger(__name__)


@vllm_internals.with_whole_decoder_prompts
class WhisperAlignForConditionalGeneration(WhisperForConditionalGeneration):
    """Drop-in replacement registered for ``WhisperForConditionalGeneration`` by the plugin."""

    @classmethod
    def get_generation_prompt(cls, stt_params):
        """vLLM's prompt, except that English-only models get theirs (no language/task tokens).

        vLLM 0.32 gives ``*.en`` models the multilingual prompt, which they answer with nothing.
        """
        if not is_english_only_vocab(stt_params.model_config.hf_config.vocab_size):
            return super().get_generation_prompt(stt_params)
        prompt = super().get_generation_prompt(replace(stt_params, language="en"))
        previous = f"<|startofprev|>{stt_params.request_prompt}" if stt_params.request_prompt else ""
        prompt["decoder_prompt"] = TextPrompt(prompt=previous + "".join(ENGLISH_ONLY_START))
        return prompt

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        vllm_internals.check_whisper_model_internals()
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config
        generation_config = vllm_config.model_config.try_get_generation_config()
        self.align_config = WhisperAlignConfig.from_additional_config(vllm_config.additional_config)
        if self.align_config.encoder_int8:
            supported, why = encoder_int8_supported()
            if not supported:
                raise ValueError(f"whisper_align.encoder_int8: {why}")
        self.alignment_heads = resolve_alignment_heads(
            getattr(config, "alignment_heads", None),
            generation_config.get("alignment_heads"),
            config.decoder_layers,
            config.decoder_attention_heads,
        )
        self.captured_heads = captured_heads(
            self.alignment_heads, config.decoder_layers, config.decoder_attention_heads
        )
        self.encoder_cache = self._encoder_cache(vllm_config)
        self.alignment_capture: AlignmentCapture | None = None
        if get_tensor_model_parallel_world_size() > 1:
            # Heads are split across ranks; gathering them is not implemented yet.
            logger.warning("Word timestamps are disabled under tensor parallelism (TP > 1).")
            return
        self._install_capture(vllm_config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        hidden_states = super().forward(input_ids, positions, *args, **kwargs)
        if self.alignment_capture is not None:
            # Every row, whoever asked: the no-speech row of a request is only known after the step.
            self.alignment_capture.hidden[: hidden_states.shape[0]].copy_(hidden_states)
        return hidden_states

    def embed_multimodal(self, **kwargs: object):
        """vLLM's encoder pass, run only on the inputs whose output the encoder cache lacks."""
        if self.encoder_cache is None:
            return super().embed_multimodal(**kwargs)
        features = vllm_internals.audio_input_features(self, kwargs)
        inputs = list(features.unbind(0)) if isinstance(features, torch.Tensor) else list(features)
        return tuple(
            encode_with_cache(
                self.encoder_cache, inputs, lambda batch: self.model.get_encoder_outputs(batch).unbind(0)
            )
        )

    def load_weights(self, weights):
        with vllm_internals.weight_conversions_counted() as conversions:
            loaded = super().load_weights(weights)
        for (stored, running), count in conversions.items():
            logger.info(
                "%d weights of the checkpoint converted from %s to %s as they loaded",
                count,
                stored.removeprefix("torch."),
                running.removeprefix("torch."),
            )
        if self.align_config.encoder_int8:
            swapped = quantize_encoder_linears(self.model.encoder)
            logger.info("Encoder: %d linear layers in int8 (dynamic per-token activations)", swapped)
        return loaded

    def _encoder_cache(self, vllm_config: VllmConfig) -> EncoderOutputCache | None:
        mib = self.align_config.encoder_cache_mib
        if not mib:
            return None
        if vllm_config.device_config.device_type != "cpu":
            # Held outside vLLM's memory accounting, which sizes the KV cache to what a GPU has left;
            # never run on a GPU either (none was lent to this project).
            logger.info("Encoder cache: off (CPU only)")
            return None
        return EncoderOutputCache(mib << 20)

    def _install_capture(self, vllm_config: VllmConfig) -> None:
        scheduler_config = vllm_config.scheduler_config
        config = vllm_config.model_config.hf_config
        max_tokens = scheduler_config.max_num_batched_tokens
        encoder_rows = config.max_source_positions
        # Whole encoder outputs only: round the encoder budget up to a number of 30 s windows.
        max_encoder_rows = max(1, -(-encoder_rows_per_step(vllm_config) // encoder_rows)) * encoder_rows
        layers = []
        for layer_index, heads in self.captured_heads.by_layer().items():
            attention = self.model.decoder.layers[layer_index].encoder_attn
            layers.append(
                vllm_internals.capture_cross_attention(attention, heads, max_tokens, max_encoder_rows)
            )
        self.alignment_capture = AlignmentCapture(
            layers=layers,
            head_dim=config.d_model // config.decoder_attention_heads,
            max_decoder_rows=config.max_target_positions,
            encoder_rows=encoder_rows,
            max_requests=scheduler_config.max_num_seqs,
            result_ttl_s=self.align_config.result_ttl_s,
            max_parked=self.align_config.max_parked,
            hidden=self.proj_out.weight.new_zeros((max_tokens, config.d_model)),
            logits_of=self.compute_logits,
            tuned_heads=self.captured_heads.tuned,
            candidate_heads=self.captured_heads.candidates,
        )
        logger.info(
            "Word timestamps: capturing %d heads in %d decoder layers (%d alignment heads from %s; "
            "per-request selection from %d)",
            len(self.captured_heads.heads),
            len(layers),
            len(self.alignment_heads.heads),
            self.alignment_heads.source,
            len(self.captured_heads.candidates),
        )
