"""Servers shared by the modules of tests/server: each start costs half a minute, so a server that
several modules can use alike is started once (and stopped when the session ends)."""

from __future__ import annotations

import os

import pytest

from tests.support.servers import (
    API_KEY,
    BODY_IDLE_S,
    SHARED_SERVER_ENV,
    TWO_AT_A_TIME,
    running_server,
    whisper_align_args,
)


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


@pytest.fixture(scope="session")
def guarded_server(model_dir, tmp_path_factory):
    """A server behind ``--api-key API_KEY`` that cuts off an upload idle for BODY_IDLE_S, and runs every
    request in its own window (whisper_align.packing off): test_hardening's, and the 32 concurrent
    requests' of test_server (each answer equal to its clip alone: packed, a clip's decoder would read
    its neighbours as context). Neither reads the other's settings; one start, not two."""
    args = ["--api-key", API_KEY, *whisper_align_args(packing=False)]
    env = {"VLLM_WHISPER_ALIGN_BODY_IDLE_S": str(BODY_IDLE_S)}
    with running_server(model_dir, tmp_path_factory.mktemp("guarded"), env=env, args=args) as base:
        yield base


@pytest.fixture(scope="session")
def options_server(model_dir, tmp_path_factory):
    """A server whose engines run TWO_AT_A_TIME requests at once, with two plugin options away from their
    defaults: urgent requests' head start 1 s (``urgent_head_start_s``: test_streaming's flood) and
    forced alignments packed (``pack_alignments``: test_server's packed alignments). Neither test sends
    what the other's option acts on (the flood: transcriptions; the alignments: no file over a window
    waits); one start, not two."""
    options = whisper_align_args(urgent_head_start_s=1, pack_alignments=True)
    args = ["--max-num-seqs", str(TWO_AT_A_TIME), *options]
    with running_server(model_dir, tmp_path_factory.mktemp("options"), args=args) as base:
        yield base
