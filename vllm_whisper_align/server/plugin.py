"""What vLLM's API server loads from the ``vllm.endpoint_plugins`` group (named in VLLM_PLUGINS)."""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.datastructures import State

from vllm_whisper_align.log import get_logger
from vllm_whisper_align.options import echo
from vllm_whisper_align.server.limits import ServerLimits

if TYPE_CHECKING:
    from vllm_whisper_align.runners.live import LiveStreams
    from vllm_whisper_align.runners.service import AlignmentService
    from vllm_whisper_align.server.uploads import Decoders

logger = get_logger(__name__)


@dataclass
class ServerState:
    """What the routes share: the engine's runner, the names the model is served under, the limits, the
    decoding lanes, the open live streams (``/v1/realtime``)."""

    service: AlignmentService
    served_model_names: list[str]
    limits: ServerLimits
    decoders: Decoders
    live: LiveStreams

    def check_model(self, model: str | None) -> None:
        from vllm_whisper_align.server.errors import RequestError

        if model and model not in self.served_model_names:
            raise RequestError(
                f"The model {echo(model)} does not exist; this server serves "
                + ", ".join(f"`{name}`" for name in self.served_model_names),
                "model",
            )


class WhisperAlignEndpoints:
    """Overrides /v1/audio/transcriptions and /v1/audio/translations; adds /v1/audio/alignments and, for
    Whisper (which vLLM serves none for), the realtime WebSocket /v1/realtime."""

    name = "whisper-align"
    required_tasks = ("transcription",)

    def attach_router(self, app: FastAPI) -> None:
        from vllm_whisper_align.server import realtime, routes
        from vllm_whisper_align.server.errors import answer_errors_as_openai

        app.include_router(routes.router)
        app.include_router(realtime.router)
        answer_errors_as_openai(app)

    async def init_state(self, engine_client, state: State, args: Namespace) -> None:
        from vllm_whisper_align.runners.live import LiveStreams
        from vllm_whisper_align.runners.service import AlignmentService
        from vllm_whisper_align.server.uploads import Decoders

        if engine_client is None:
            logger.warning("whisper-align: no engine (render-only server); routes will answer 503")
            state.whisper_align = None
            return
        names = getattr(args, "served_model_name", None) or [args.model]
        limits = ServerLimits.from_env()
        service = await AlignmentService.create(
            engine_client, max_audio_s=limits.max_audio_s, temperatures_at_once=True
        )
        await service.warm_up()
        live = LiveStreams(service, limits.max_live_streams, max_waiting_s=limits.max_audio_s)
        state.whisper_align = ServerState(service, list(names), limits, Decoders(), live)
