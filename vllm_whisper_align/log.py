"""Our loggers, hung under vLLM's ``vllm`` logger so that vLLM's logging configuration covers them.

vLLM configures only the ``vllm`` logger (its handler, ``--log-level``, ``VLLM_LOGGING_CONFIG_PATH``), in
every process it starts. Loggers named after this package sat outside it, with no handler: their INFO
lines vanished, in the server too. Named ``vllm.whisper_align.*``, they share vLLM's handler and level.
"""

from __future__ import annotations

from vllm.logger import init_logger

PACKAGE_LOGGER = "vllm.whisper_align"


def get_logger(module_name: str):
    """The logger of one of our modules: ``vllm_whisper_align.capture`` -> ``vllm.whisper_align.capture``."""
    _, _, submodule = module_name.partition(".")
    return init_logger(f"{PACKAGE_LOGGER}.{submodule}" if submodule else PACKAGE_LOGGER)

