"""A corpus job's bookkeeping: the manifest, what is done, one batch's work, the summary.

``vllm-whisper-align batch --manifest FILE.jsonl --output-dir DIR`` runs this on Ray (the wiring is in
``batch.on_ray``, so that this module needs neither Ray nor vLLM to import):

- the manifest is JSON lines, ``{"id": ..., "audio": ...}`` plus an optional ``"text"`` (forced
  alignment instead of transcription) and ``"language"``; it is checked whole before anything starts;
- an id is done when ``DIR/<id>.json`` exists. That file is written to a temporary name and renamed,
  so a killed job never leaves a half file that would count as done; a rerun skips the done ids and
  never touches their files;
- ``DIR/summary.jsonl`` is a log, appended to: one row per item a run processed (``ok`` or ``error``,
  with the error), tagged with the run. An id's status is its last row. A failed item has no
  ``<id>.json``, so the next run tries it again;
- every file is created as ``open`` creates it (0666 less the umask), and once the job's driver is gone
  nothing more is written (``batch.lifetime``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from vllm_whisper_align.constants import SAMPLE_RATE
from vllm_whisper_align.options import DEFAULT_ALIGNMENT_METHOD, AlignmentOptions, TranscriptionOptions

if TYPE_CHECKING:
    from vllm_whisper_align.align.results import Transcript

SUMMARY_NAME = "summary.jsonl"
RESULT_SUFFIX = ".json"
TEMP_SUFFIX = ".tmp"
# File names are at most 255 bytes; an id also carries the temporary file's prefix and suffix.
MAX_ID_BYTES = 200
STATUS_OK, STATUS_ERROR = "ok", "error"
# The row of an item whose result a batch Ray ran again had already written: not summarised again.
STATUS_SKIPPED = "skipped"
# Seconds between two progress lines (the last one is always printed).
PROGRESS_INTERVAL_S = 5.0


class ManifestError(ValueError):
    """A manifest that cannot run: the message is one line naming the file and line."""


@dataclass(frozen=True)
class Item:
    id: str
    audio: str  # a local path (absolute) or a URI that fsspec or pyarrow reads
    text: str | None = None
    language: str | None = None

    def as_row(self) -> dict[str, Any]:
        return {"id": self.id, "audio": self.audio, "text": self.text, "language": self.language}


# ---- the manifest ------------------------------------------------------------------------------


def read_manifest(path: str | os.PathLike) -> list[Item]:
    """Every item of a JSON-lines manifest, checked: ids present, unique and safe as file names.

    Relative local audio paths are taken from the manifest's folder. Keys other than id, audio, text
    and language are ignored. Raises ManifestError on the first bad line.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ManifestError(f"{path}: {error}") from None
    items: list[Item] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = parse_item(json.loads(line), path.parent)
        except (json.JSONDecodeError, ValueError) as error:
            raise ManifestError(f"{path}:{number}: {error}") from None
        if item.id in seen:
            raise ManifestError(f"{path}:{number}: duplicate id {item.id!r} (first on line {seen[item.id]})")
        seen[item.id] = number
        items.append(item)
    if not items:
        raise ManifestError(f"{path}: no items")
    return items


def parse_item(entry: Any, base: Path) -> Item:
    if not isinstance(entry, dict):
        raise ValueError('need a JSON object {"id": ..., "audio": ...}')
    for key in ("id", "audio"):
        if key not in entry or entry[key] is None:
            raise ValueError(f'missing "{key}"')
    item_id = entry["id"]
    if isinstance(item_id, bool) or not isinstance(item_id, (str, int)):
        raise ValueError(f'"id" must be a string (or an integer), not {type(item_id).__name__}')
    item_id = check_id(str(item_id))
    audio = entry["audio"]
    if not isinstance(audio, str) or not audio.strip():
        raise ValueError('"audio" must be a non-empty string (a path or a URI)')
    optional = {}
    for key in ("text", "language"):
        value = entry.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f'"{key}" must be a string')
        optional[key] = value or None
    return Item(item_id, resolve_audio(audio, base), **optional)


def check_id(item_id: str) -> str:
    """``item_id`` if it is a safe file name (DIR/<id>.json), else ValueError."""
    if not item_id:
        raise ValueError("empty id")
    if "/" in item_id or "\\" in item_id or "\0" in item_id:
        raise ValueError(f"id {item_id!r} is not a file name (it has a path separator or NUL)")
    if item_id.startswith("."):
        raise ValueError(f"id {item_id!r} starts with '.' (hidden, or '..'): not accepted as a file name")
    if any(ord(c) < 32 for c in item_id):
        raise ValueError(f"id {item_id!r} has control characters")
    if len(item_id.encode()) > MAX_ID_BYTES:
        raise ValueError(f"id {item_id[:40]!r}... is longer than {MAX_ID_BYTES} bytes")
    return item_id


def is_uri(audio: str) -> bool:
    """``scheme://...`` (s3://, gs://, file://, memory://...); a Windows drive letter is not a scheme."""
    scheme, sep, _ = audio.partition("://")
    return bool(sep) and len(scheme) > 1 and scheme.replace("+", "").replace("-", "").isalnum()


def resolve_audio(audio: str, base: Path) -> str:
    if is_uri(audio):
        return audio
    path = Path(audio).expanduser()
    return str(path if path.is_absolute() else (base / path).absolute())


# ---- what is done ------------------------------------------------------------------------------


def result_path(output_dir: Path, item_id: str) -> Path:
    return output_dir / f"{item_id}{RESULT_SUFFIX}"


def done_ids(output_dir: Path, items: Iterable[Item]) -> set[str]:
    """Ids of ``items`` whose result file is in ``output_dir`` (temporary files never count)."""
    if not output_dir.is_dir():
        return set()
    present = {entry.name for entry in os.scandir(output_dir) if entry.name.endswith(RESULT_SUFFIX)}
    return {item.id for item in items if f"{item.id}{RESULT_SUFFIX}" in present}


def remove_stale_temporaries(output_dir: Path) -> int:
    """Temporary files a killed run left behind (never counted as done); returns how many went."""
    removed = 0
    for path in output_dir.glob(f".*{RESULT_SUFFIX}.*{TEMP_SUFFIX}"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def write_atomically(path: Path, text: str, may_write: Callable[[], bool] = lambda: True) -> bool:
    """``text`` to ``path`` through a temporary file in the same folder and a rename: whoever looks
    (a rerun, a reader) sees the whole file or none. The file's mode is what ``open`` gives (0666 less the
    umask). ``may_write`` is asked before the temporary file is made and again before the rename; when it
    says no, nothing is left behind and False is returned."""
    if not may_write():
        return False
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}"
    try:
        with open(temporary, "x") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if not may_write():
            os.unlink(temporary)
            return False
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return True


# ---- reading audio -----------------------------------------------------------------------------


def read_audio(audio: str):
    """Samples of a local file or of a URI (read as bytes with fsspec, else pyarrow, then decoded)."""
    from vllm_whisper_align.audio.decode import decode_audio

    if not is_uri(audio):
        return decode_audio(audio, spill=True)
    return decode_audio(_read_uri(audio), spill=True)


def _read_uri(uri: str) -> bytes:
    try:
        import fsspec
    except ImportError:
        fsspec = None
    if fsspec is not None:
        protocol = uri.split("://", 1)[0]
        try:
            fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError):
            pass  # not fsspec's (or its backend is not installed): pyarrow may know it
        else:
            with fsspec.open(uri, "rb") as file:
                return file.read()
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(uri)
    with filesystem.open_input_stream(path) as stream:
        return stream.read()


# ---- one batch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobOptions:
    output_dir: str
    language: str | None = None  # for items without their own; None: detect
    alignment_method: str | None = None


async def process_batch(
    service, items: Sequence[Item], options: JobOptions, may_write: Callable[[], bool] = lambda: True
) -> list[dict[str, Any]]:
    """Transcribe or align ``items`` on ``service`` and write each result; one row per item, in order.

    ``service`` is the server's ``AlignmentService`` over the replica's engine. Every item is its own
    requests, all sent at once: they batch with each other and with the items of any other batch in
    flight on the engine, so the engine stays full from one batch to the next. A failure of one item (a
    missing or undecodable file, text that cannot be aligned) becomes its error row: nothing raises out
    of here. An item whose result file already exists (a batch Ray runs again) is not redone: its row
    says ``skipped``. ``may_write`` is asked before each step of writing a result (a replica's: whether
    its job is still there); a result it refuses is the item's error row.
    """
    output_dir = Path(options.output_dir)
    return list(
        await asyncio.gather(
            *[_process_item(service, item, options, output_dir, may_write) for item in items]
        )
    )


async def _process_item(
    service, item: Item, options: JobOptions, output_dir: Path, may_write: Callable[[], bool]
) -> dict[str, Any]:
    if result_path(output_dir, item.id).exists():
        return {"id": item.id, "status": STATUS_SKIPPED, "error": None}
    language = item.language or options.language
    method = options.alignment_method or DEFAULT_ALIGNMENT_METHOD
    request_id = f"batch-{item.id}-{uuid.uuid4().hex[:8]}"  # unique if Ray runs the batch again
    try:
        samples = await asyncio.to_thread(read_audio, item.audio)
        if item.text is not None:
            result = await service.align(
                samples,
                request_id=request_id,
                text=item.text,
                language=language,
                options=AlignmentOptions(method),
            )
        else:
            result = await service.transcribe(
                samples,
                request_id=request_id,
                language=language,
                options=TranscriptionOptions(alignment_method=method),
            )
        await asyncio.to_thread(_write_result, output_dir, item, result, may_write)
    except Exception as error:  # any reader's or the engine's error: the item fails, the batch goes on
        return error_row(item, error)
    return {
        "id": item.id,
        "status": STATUS_OK,
        "error": None,
        "audio_seconds": round(len(samples) / SAMPLE_RATE, 3),
        "words": len(result.words or []),
        "language": result.language,
    }


def _write_result(output_dir: Path, item: Item, result: Transcript, may_write: Callable[[], bool]) -> None:
    from vllm_whisper_align.formats.responses import write_result

    if not write_atomically(
        result_path(output_dir, item.id), write_result(result, "verbose_json"), may_write
    ):
        raise RuntimeError("not written: the job it was for is no longer there")


def error_row(item: Item, error: BaseException) -> dict[str, Any]:
    message = " ".join(str(error).split()) or type(error).__name__
    return {"id": item.id, "status": STATUS_ERROR, "error": f"{type(error).__name__}: {message}"}


# ---- the summary -------------------------------------------------------------------------------


def read_summary(path: Path) -> list[dict[str, Any]]:
    """The summary's rows; a line a kill cut short is skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "id" in row:
            rows.append(row)
    return rows


def latest_status(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each id's last row (its status now)."""
    return {row["id"]: row for row in rows}


class Summary:
    """``DIR/summary.jsonl``, appended to one row at a time (flushed: a kill loses no finished row)."""

    def __init__(self, output_dir: Path, run: str):
        self.path = output_dir / SUMMARY_NAME
        self.run = run
        self._file: TextIO | None = None

    def __enter__(self) -> Summary:
        self._file = open(self.path, "a+")  # noqa: SIM115 (closed by __exit__)
        self._file.seek(0, os.SEEK_END)
        if self._file.tell():  # a line a kill cut short: start on a line of our own
            self._file.seek(self._file.tell() - 1)
            last = self._file.read(1)
            if last != "\n":
                self._file.write("\n")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def append(self, row: dict[str, Any]) -> None:
        full = {
            "id": row["id"],
            "status": row["status"],
            "error": row.get("error"),
            "audio_seconds": row.get("audio_seconds"),
            "words": row.get("words"),
            "language": row.get("language"),
            "run": self.run,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        full.update({k: v for k, v in row.items() if k not in full})
        self._file.write(json.dumps(full) + "\n")
        self._file.flush()


def recover_rows(
    output_dir: Path, done: set[str], summary_rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Rows for done ids whose ``ok`` row is missing (the job was killed between writing the result and
    its row), read back from their files, so that the summary has an ``ok`` row for every done id."""
    status = latest_status(summary_rows)
    rows = []
    for item_id in sorted(done):
        if status.get(item_id, {}).get("status") == STATUS_OK:
            continue
        try:
            result = json.loads(result_path(output_dir, item_id).read_text())
            seconds, words = result.get("duration"), len(result.get("words") or [])
        except (OSError, ValueError):
            seconds = words = None
        rows.append(
            {
                "id": item_id,
                "status": STATUS_OK,
                "error": None,
                "audio_seconds": seconds,
                "words": words,
                "language": result.get("language") if seconds is not None else None,
                "recovered": True,
            }
        )
    return rows


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}"


# ---- progress ----------------------------------------------------------------------------------


class Progress:
    """Items and audio hours done, on stderr: at most one line every PROGRESS_INTERVAL_S, and the last."""

    def __init__(self, total: int, skipped: int, stream: TextIO = sys.stderr):
        self.total, self.skipped, self.stream = total, skipped, stream
        self.ok = self.errors = 0
        self.audio_seconds = 0.0
        self.started = time.monotonic()
        self._last = float("-inf")

    def add(self, row: dict[str, Any]) -> None:
        if row["status"] == STATUS_OK:
            self.ok += 1
            self.audio_seconds += row.get("audio_seconds") or 0.0
        elif row["status"] == STATUS_ERROR:
            self.errors += 1
        if time.monotonic() - self._last >= PROGRESS_INTERVAL_S:
            self.show()

    def show(self) -> None:
        self._last = time.monotonic()
        done = self.ok + self.errors
        elapsed = time.monotonic() - self.started
        speed = f", {self.audio_seconds / elapsed:.1f} audio s per s" if elapsed > 0 and self.ok else ""
        print(
            f"batch: {done}/{self.total} items ({self.ok} ok, {self.errors} failed; {self.skipped} done "
            f"before), {self.audio_seconds / 3600:.3f} audio hours{speed}, {elapsed:.0f} s",
            file=self.stream,
            flush=True,
        )
