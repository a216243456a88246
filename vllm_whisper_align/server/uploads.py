"""Uploads: request bodies read within bounds, and their audio decoded where no request class can stall
the others.

A body is read no further than the size limit allows, and no longer than ``body_idle_s`` between two of
its chunks (a client that stalls mid-upload holds nothing for long). Decoding runs in two pools of its own,
apart from the event loop's default pool in which requests are finished: a file whose header states a
short length takes the quick lane; anything else (a long recording, a file that states no length, as a
decompression bomb does) the slow lane, where such files wait for each other rather than for the clips.
A file whose header understates its length is given up in the quick lane once it decodes past the lane's
bound, and decoded again in the slow lane. A decode whose client has gone away stops at its next block.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from vllm_whisper_align.audio.decode import DecodeGaveUp, decode_audio, stated_seconds
from vllm_whisper_align.server.errors import RequestError
from vllm_whisper_align.server.limits import ServerLimits

# Room in a body for the form's other fields and the multipart framing, besides the audio file.
FORM_FIELDS_BYTES = 2**20
# Files whose header states at most this length are decoded in the quick lane.
QUICK_LANE_SECONDS = 120.0
# The quick lane gives a decode up this far past QUICK_LANE_SECONDS, whatever the header stated: the lane's
# own bound, not the header's length plus a margin, since stated lengths may be estimates (FFmpeg's, from
# the bit rate, for an mp3 with no Xing header) that honest files overrun, and a decode given up is done
# twice; so a lying header costs the quick lane no more than the longest honest clip it takes. The margin
# is for codecs that decode a little past the length they state (mp3's and AAC's padding frames).
QUICK_LANE_OVERRUN_SECONDS = 1.0
QUICK_LANE_THREADS, SLOW_LANE_THREADS = 2, 1


async def read_form(request: Request, limits: ServerLimits) -> Any:
    """The multipart form of ``request``, its body read within the limits (RequestError past them)."""
    max_body = limits.max_file_bytes + FORM_FIELDS_BYTES
    stated = request.headers.get("content-length")
    if stated is not None and stated.isdigit() and int(stated) > max_body:
        raise _too_large(limits)
    received = 0

    async def bounded_receive():
        nonlocal received
        try:
            message = await asyncio.wait_for(request.receive(), limits.body_idle_s)
        except TimeoutError:
            raise RequestError(
                f"the request body stalled: nothing came for {limits.body_idle_s:g} s", status=408
            ) from None
        received += len(message.get("body", b""))
        if received > max_body:
            raise _too_large(limits)
        return message

    try:
        return await Request(request.scope, bounded_receive).form()
    except RequestError:
        raise
    except Exception as error:  # malformed multipart bodies raise assorted parser errors
        raise RequestError(f"could not read the multipart form: {error}") from None


def _too_large(limits: ServerLimits) -> RequestError:
    return RequestError(
        f"the request is over {limits.max_file_mb:g} MB, the most a `file` may be "
        f"({limits.max_file_bytes} bytes)",
        "file",
    )


async def read_upload(form: Any, limits: ServerLimits) -> bytes:
    """The ``file`` part's bytes, its size checked before it is read into memory."""
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise RequestError("`file` is required: the audio file to process, as a multipart upload", "file")
    if upload.size is not None and upload.size > limits.max_file_bytes:
        raise RequestError(
            f"file is {upload.size} bytes; at most {limits.max_file_bytes} bytes ({limits.max_file_mb:g} MB) "
            "are accepted",
            "file",
        )
    data = await upload.read()
    if not data:
        raise RequestError("`file` is empty", "file")
    return data


class Decoders:
    """The two decoding lanes of a server."""

    def __init__(self):
        self.quick = ThreadPoolExecutor(QUICK_LANE_THREADS, thread_name_prefix="decode-quick")
        self.slow = ThreadPoolExecutor(SLOW_LANE_THREADS, thread_name_prefix="decode-slow")

    async def decode(self, data: bytes, max_seconds: float):
        """``data`` decoded (``audio.decode.decode_audio``, spilled when long) in its lane, a file that
        outgrows the quick lane again in the slow one; stopped when the awaiting request is cancelled (its
        client went away)."""
        loop = asyncio.get_running_loop()
        seconds = await loop.run_in_executor(self.quick, stated_seconds, data)  # a header probe: quick
        stop = threading.Event()
        decode = functools.partial(decode_audio, data, max_seconds=max_seconds, spill=True, stop=stop)
        try:
            if seconds is not None and seconds <= QUICK_LANE_SECONDS:
                quick = functools.partial(
                    decode, give_up_seconds=QUICK_LANE_SECONDS + QUICK_LANE_OVERRUN_SECONDS
                )
                try:
                    return await loop.run_in_executor(self.quick, quick)
                except DecodeGaveUp:
                    pass  # its header understated it: a long file, decoded again with the long files
            return await loop.run_in_executor(self.slow, decode)
        except asyncio.CancelledError:
            stop.set()
            raise
