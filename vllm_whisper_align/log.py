"""Our loggers, hung under vLLM's ``vllm`` logger so that vLLM's logging configuration covers them.

vLLM configures only the ``vllm`` logger (its handler, ``--log-level``, ``VLLM_LOGGING_CONFIG_PATH``), in
every process it starts. Loggers named after this package sat outside it, with no handler: their INFO
lines vanished, in the server too. Named ``vllm.whisper_align.*``, they share vLLM's handler and level.
"""

from __future__ import annotations

import copy
from typing import Any

from vllm.logger import DEFAULT_LOGGING_CONFIG, init_logger

PACKAGE_LOGGER = "vllm.whisper_align"


def get_logger(module_name: str):
    """The logger of one of our modules: ``vllm_whisper_align.engine.capture`` is
    ``vllm.whisper_align.engine.capture``."""
    _, _, submodule = module_name.partition(".")
    return init_logger(f"{PACKAGE_LOGGER}.{submodule}" if submodule else PACKAGE_LOGGER)


def quiet_logging_config(stream: str) -> dict[str, Any]:
    """vLLM's own logging config (its format, its handler), with vLLM's loggers at ERROR only.

    Ours keep their warnings (e.g. a model without alignment heads): they are the user's business,
    while vLLM's warnings on a CPU machine are a dozen lines about its own setup.
    """
    config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
    config["handlers"]["vllm"].update(level="WARNING", stream=stream, formatter="vllm")
    config["loggers"]["vllm"]["level"] = "ERROR"
    config["loggers"][PACKAGE_LOGGER] = {"level": "WARNING"}
    return config


def vllm_logging_now() -> None:
    """vLLM's logging configuration from its environment variables, applied in this process now.

    vLLM 0.32 configures its logging only once its CLI has parsed its arguments. ``serve`` decides and
    logs its defaults before it execs vLLM's server, so without this its one line of defaults was lost.
    """
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging_if_needed

    configure_logging_if_needed(LoggingConfig())
