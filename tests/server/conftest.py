"""Servers shared by the modules of tests/server: each start costs half a minute, so a server that
several modules can use alike is started once (and stopped when the session ends)."""

from __future__ import annotations

import os

import pytest

from tests.support.servers import SHARED_SERVER_ENV, TWO_AT_A_TIME, running_server


@pytest.fixture(scope="session")
def server_log_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("server")


@pytest.fixture(scope="session")
def server(model_dir, server_log_dir):
    """`vllm-whisper-align serve` as a user would start it, on a free local port, with the limits of
    SHARED_SERVER_ENV (no --served-model-name: serve names the model itself).

    WHISPER_ALIGN_TEST_SERVER=http://host:port reuses a server already started the same way.
    """
    if os.environ.get("WHISPER_ALIGN_TEST_SERVER"):
        yield os.environ["WHISPER_ALIGN_TEST_SERVER"]
        return
    with running_server(model_dir, server_log_dir, env=SHARED_SERVER_ENV) as base:
        yield base


@pytest.fixture(scope="session")
def narrow_server(model_dir, tmp_path_factory):
    """A server whose engine runs TWO_AT_A_TIME requests at once: a few windows already make a long
    recording."""
    args = ["--max-num-seqs", str(TWO_AT_A_TIME)]
    with running_server(model_dir, tmp_path_factory.mktemp("narrow"), args=args) as base:
        yield base
