"""What vLLM's API server loads from the ``vllm.endpoint_plugins`` group (named in VLLM_PLUGINS)."""

from __future__ import annotations

from argparse import Namespace

from fastapi import FastAPI
from starlette.datastructures import State

from vllm_whisper_align.log import get_logger

logger = get_logger(__name__)


class WhisperAlignEndpoints:
    """Overrides /v1/audio/transcriptions and /v1/audio/translations; adds /v1/audio/alignments."""

    name = "whisper-align"
    required_tasks = ("transcription",)

    def attach_router(self, app: FastAPI) -> None:
        from vllm_whisper_align.server.routes import router

        app.include_router(router)

    async def init_state(self, engine_client, state: State, args: Namespace) -> None:
        from vllm_whisper_align.runners.service import AlignmentService, ServiceLimits

        if engine_client is None:
            logger.warning("whisper-align: no engine (render-only server); routes will answer 503")
            state.whisper_align = None
            return
        names = getattr(args, "served_model_name", None) or [args.model]
        state.whisper_align = await AlignmentService.create(
            engine_client, served_model_names=list(names), limits=ServiceLimits.from_env()
        )
