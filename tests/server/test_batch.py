"""The corpus job (``vllm-whisper-align batch``): the bookkeeping without an engine, then the job end to end
on a real local Ray with real engines, killed halfway and run again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.speech import sentence_clips, start_errors, write_wav
from vllm_whisper_align.align.results import Transcript
from vllm_whisper_align.align.words import Word
from vllm_whisper_align.batch import job
from vllm_whisper_align.batch.job import Item, JobOptions, ManifestError

ENGINE_OPTIONS = ["--dtype", "float32", "--max-num-seqs", "4"]
# The environment variable that marks every process one CLI run starts (Ray's, the engine's), so the
# test can wait for all of them to be gone.
MARK = "VWA_BATCH_TEST_RUN"


def write_manifest(path: Path, entries: list[dict]) -> Path:
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return path


# ---- the manifest ------------------------------------------------------------------------------


def test_manifest_items_and_paths(tmp_path):
    manifest = write_manifest(
        tmp_path / "m.jsonl",
        [
            {"id": "a", "audio": "clips/a.wav"},
            {"id": 7, "audio": "/abs/b.flac", "language": "de", "duration": 3.0},
            {"id": "c d", "audio": "s3://bucket/c.wav", "text": "hello there"},
        ],
    )
    (tmp_path / "m.jsonl").write_text(manifest.read_text() + "\n   \n")  # blank lines are skipped
    items = job.read_manifest(manifest)
    assert items == [
        Item("a", str(tmp_path / "clips" / "a.wav")),  # relative to the manifest's folder
        Item("7", "/abs/b.flac", language="de"),
        Item("c d", "s3://bucket/c.wav", text="hello there"),
    ]


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"audio": "a.wav"}, 'missing "id"'),
        ({"id": "a"}, 'missing "audio"'),
        ({"id": "a", "audio": ""}, '"audio"'),
        ({"id": "../up", "audio": "a.wav"}, "not a file name"),
        ({"id": "a/b", "audio": "a.wav"}, "not a file name"),
        ({"id": "..", "audio": "a.wav"}, "starts with '.'"),
        ({"id": ".hidden", "audio": "a.wav"}, "starts with '.'"),
        ({"id": "", "audio": "a.wav"}, "empty id"),
        ({"id": "x" * 300, "audio": "a.wav"}, "longer than"),
        ({"id": True, "audio": "a.wav"}, '"id" must be'),
        ({"id": "a", "audio": "a.wav", "text": 5}, '"text" must be'),
        (["a", "a.wav"], "JSON object"),
    ],
)
def test_manifest_refuses_bad_lines(tmp_path, entry, message):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "ok", "audio": "ok.wav"}, entry])
    with pytest.raises(ManifestError, match=f"m.jsonl:2: .*{message}"):
        job.read_manifest(manifest)


def test_manifest_refuses_duplicates_bad_json_and_nothing(tmp_path):
    entries = [{"id": "a", "audio": "1.wav"}, {"id": "a", "audio": "2.wav"}]
    manifest = write_manifest(tmp_path / "m.jsonl", entries)
    with pytest.raises(ManifestError, match="m.jsonl:2: duplicate id 'a' .first on line 1"):
        job.read_manifest(manifest)
    (tmp_path / "broken.jsonl").write_text('{"id": "a", "audio": \n')
    with pytest.raises(ManifestError, match="broken.jsonl:1:"):
        job.read_manifest(tmp_path / "broken.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ManifestError, match="no items"):
        job.read_manifest(tmp_path / "empty.jsonl")


def test_cli_bad_manifest_is_one_line_and_exit_2(tmp_path):
    """Checked before Ray or an engine starts: fails in a moment, nothing written."""
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "a/b", "audio": "x.wav"}])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_whisper_align.cli",
            "batch",
            "--manifest",
            str(manifest),
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("vllm-whisper-align")]
    assert len(errors) == 1 and "m.jsonl:1" in errors[0] and "not a file name" in errors[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_without_ray_one_line_names_the_extra(tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "audio": "x.wav"}])
    code = (
        "import sys; sys.modules['ray'] = None; from vllm_whisper_align import cli; "
        f"sys.exit(cli.main(['batch', '--manifest', {str(manifest)!r}, '--output-dir', 'out']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "pip install 'vllm-whisper-align[batch]'" in result.stderr.splitlines()[-1], result.stderr


# ---- done-set, files, summary ------------------------------------------------------------------


def test_done_ids_count_whole_result_files_only(tmp_path):
    items = [Item(name, "x.wav") for name in ("a", "b", "c", "summary")]
    job.write_atomically(tmp_path / "a.json", "{}")
    (tmp_path / ".b.json.k2j3.tmp").write_text("{half")  # what a kill mid-write leaves
    (tmp_path / "summary.jsonl").write_text("")
    (tmp_path / "other.json").write_text("{}")  # not in the manifest
    assert job.done_ids(tmp_path, items) == {"a"}
    assert job.done_ids(tmp_path / "missing", items) == set()
    assert job.remove_stale_temporaries(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "other.json", "summary.jsonl"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_result_files_follow_the_umask(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        job.write_atomically(tmp_path / "a.json", "{}")
        with job.Summary(tmp_path, "r0") as summary:
            summary.append({"id": "a", "status": "ok"})
    finally:
        os.umask(previous)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in tmp_path.iterdir()} == {
        "a.json": oct(mode),
        "summary.jsonl": oct(mode),
    }


def test_a_write_the_job_no_longer_wants_leaves_nothing(tmp_path):
    """Asked before the temporary file is made and before the rename: a no at either step, no file."""
    answers = iter([True, False])
    assert not job.write_atomically(tmp_path / "a.json", "{}", lambda: next(answers))
    assert not job.write_atomically(tmp_path / "b.json", "{}", lambda: False)
    assert list(tmp_path.iterdir()) == []
    assert job.write_atomically(tmp_path / "c.json", "{}", lambda: True)
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_summary_appends_after_a_cut_line_and_recovers_done_ids(tmp_path):
    result = {"duration": 2.5, "words": [{}, {}], "language": "en"}
    job.write_atomically(tmp_path / "a.json", json.dumps(result))
    job.write_atomically(tmp_path / "b.json", json.dumps({"duration": 1.0, "words": []}))
    job.write_atomically(tmp_path / "e.json", json.dumps({"duration": 4.0, "words": [{}]}))
    (tmp_path / "summary.jsonl").write_text(
        json.dumps({"id": "e", "status": "error", "run": "r0"})
        + "\n"  # failed once, done since
        + json.dumps({"id": "b", "status": "ok", "run": "r0"})
        + "\n"
        + '{"id": "a", "sta'  # killed mid-row
    )
    rows = job.read_summary(tmp_path / "summary.jsonl")
    recovered = job.recover_rows(tmp_path, {"a", "b", "e"}, rows)
    assert [(r["id"], r["audio_seconds"], r["words"], r["recovered"]) for r in recovered] == [
        ("a", 2.5, 2, True),
        ("e", 4.0, 1, True),
    ]
    recovered = recovered[:1]
    with job.Summary(tmp_path, "r1") as summary:
        for row in recovered:
            summary.append(row)
        summary.append({"id": "c", "status": "error", "error": "AudioError: no such file"})
    rows = job.read_summary(tmp_path / "summary.jsonl")
    assert [(r["id"], r["status"], r["run"]) for r in rows] == [
        ("e", "error", "r0"),
        ("b", "ok", "r0"),
        ("a", "ok", "r1"),
        ("c", "error", "r1"),
    ]
    assert job.latest_status(rows + [{"id": "c", "status": "ok"}])["c"]["status"] == "ok"


class FakeService:
    """Stands in for the server's AlignmentService in the per-item logic only (the engine's own tests
    are elsewhere; the job end to end below runs the real one): alignment of a text with "!" fails, as
    text the model cannot take would."""

    def __init__(self):
        self.calls = []

    async def transcribe(self, samples, *, request_id, language, **_):
        self.calls.append(("transcribe", request_id.split("-")[1], language))
        return Transcript("transcribe", language or "en", 1.0, "t", [], [Word(0.0, 0.5, "t", 0.9)])

    async def align(self, samples, *, request_id, text, language, **_):
        self.calls.append(("align", request_id.split("-")[1], language))
        await asyncio.sleep(0)  # the others run meanwhile
        if "!" in text:
            raise ValueError("text does not fit")
        words = [Word(k, k + 0.5, " " + word, 0.9) for k, word in enumerate(text.split())]
        return Transcript("align", language or "en", 1.0, text, [], words, [])


def test_one_failing_item_fails_alone(tmp_path):
    audio = tmp_path / "a.wav"
    write_wav(audio, sentence_clips()[1].samples[:16000])
    items = [
        Item("t1", str(audio)),
        Item("t2", str(audio), language="fr"),
        Item("missing", str(tmp_path / "no.wav")),
        Item("a1", str(audio), text="one two"),
        Item("a2", str(audio), text="bad!"),
        Item("a3", str(audio), text="three"),
        Item("done", str(audio)),
    ]
    (tmp_path / "done.json").write_text("{}")
    service = FakeService()
    rows = asyncio.run(job.process_batch(service, items, JobOptions(str(tmp_path), language="en")))
    assert [(r["id"], r["status"]) for r in rows] == [
        ("t1", "ok"),
        ("t2", "ok"),
        ("missing", "error"),
        ("a1", "ok"),
        ("a2", "error"),
        ("a3", "ok"),
        ("done", "skipped"),
    ]
    assert "no such file" in rows[2]["error"] and "does not fit" in rows[4]["error"]
    assert rows[3]["words"] == 2 and rows[0]["audio_seconds"] == 1.0 and rows[1]["language"] == "fr"
    # one request each, the item's language over the job's; neither the missing file nor the done item
    assert sorted(service.calls) == [
        ("align", "a1", "en"),
        ("align", "a2", "en"),
        ("align", "a3", "en"),
        ("transcribe", "t1", "en"),
        ("transcribe", "t2", "fr"),
    ]
    assert [w["word"] for w in json.loads((tmp_path / "a1.json").read_text())["words"]] == [" one", " two"]
    assert not (tmp_path / "a2.json").exists() and (tmp_path / "done.json").read_text() == "{}"
    assert not list(tmp_path.glob(".*.tmp"))


def test_audio_from_a_uri(tmp_path):
    path = tmp_path / "a.wav"
    write_wav(path, sentence_clips()[1].samples)
    assert len(job.read_audio(path.as_uri())) == len(job.read_audio(str(path)))
    assert job.is_uri("s3://b/k") and job.is_uri("memory://x") and not job.is_uri("C:/x")
    with pytest.raises(Exception, match="no.wav"):
        job.read_audio((tmp_path / "no.wav").as_uri())


# A replica's process in miniature (batch.lifetime.Lifeline), given the driver's pid, with a child of its
# own; prints both pids, then waits. Run by a "raylet", run by a "driver".
WATCHER_SCRIPT = """
import os, subprocess, sys, time
from vllm_whisper_align.batch.lifetime import Driver, Lifeline
Lifeline(Driver.of(int(sys.argv[1])), 0.1)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"{os.getpid()} {child.pid}", flush=True)
time.sleep(600)
"""
RAYLET_SCRIPT = (
    f"import subprocess, sys; subprocess.run([sys.executable, '-c', {WATCHER_SCRIPT!r}, sys.argv[1]])"
)
DRIVER_SCRIPT = (
    f"import os, subprocess, sys; subprocess.run([sys.executable, '-c', {RAYLET_SCRIPT!r}, str(os.getpid())])"
)


@pytest.mark.parametrize("killed", ["driver", "parent"])
def test_a_replica_exits_with_its_driver_or_its_parent_and_takes_its_children(killed):
    """The driver killed (SIGKILL: nothing runs there) while the replica's parent lives on, or its parent
    killed: the replica kills its own child and exits."""
    import psutil

    driver = subprocess.Popen([sys.executable, "-c", DRIVER_SCRIPT], stdout=subprocess.PIPE, text=True)
    watcher_pid, child_pid = (int(pid) for pid in driver.stdout.readline().split())
    watcher, child = psutil.Process(watcher_pid), psutil.Process(child_pid)
    parent = watcher.parent()
    assert watcher.is_running() and child.is_running() and parent.parent().pid == driver.pid
    if killed == "driver":
        driver.kill()
    else:
        parent.kill()
    gone, alive = psutil.wait_procs([watcher, child], timeout=30)
    for process in [*alive, parent]:
        with contextlib.suppress(psutil.Error):
            process.kill()
    driver.kill()
    driver.wait()
    assert not alive, f"still running after their {killed} was killed: {alive}"


# A driver with a process of the job that the reaper must find: one started by a child that exits, in a
# session of its own (out of the driver's process group and tree, found by its mark), or one started
# with an empty environment (no mark, as a process that sets its title shows none: found in the tree).
# Prints that process's pid.
JOB_PROCESS = {
    "escaped": """
import subprocess, sys
escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(escaped.pid, flush=True)
""",
    "unmarked": """
import subprocess, sys
unmarked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={})
print(unmarked.pid, flush=True)
unmarked.wait()
""",
}
REAPED_DRIVER = """
import subprocess, sys, time
from vllm_whisper_align.batch.lifetime import reaped_with_this_process
with reaped_with_this_process():
    subprocess.Popen([sys.executable, "-c", sys.argv[1]])
    time.sleep(600)
"""


@pytest.mark.parametrize("kind", sorted(JOB_PROCESS))
def test_a_reaper_kills_what_the_job_started_when_its_driver_is_killed(kind):
    import psutil

    from vllm_whisper_align.batch.lifetime import REAPER_LOOK_S

    command = [sys.executable, "-c", REAPED_DRIVER, JOB_PROCESS[kind]]
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    job_process = psutil.Process(int(driver.stdout.readline()))
    time.sleep(2 * REAPER_LOOK_S)  # the reaper has looked at the driver's descendants
    assert job_process.is_running()
    driver.kill()
    driver.wait()
    gone, alive = psutil.wait_procs([job_process], timeout=15)
    for process in alive:
        process.kill()
    assert not alive, f"a process of the job ({kind}) outlived its killed driver"


# ---- end to end: real Ray, real engines --------------------------------------------------------


def start_cli(*args: str, mark: str, **popen) -> subprocess.Popen:
    env = dict(os.environ, **{MARK: mark})
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_whisper_align.cli", "batch", *args, *ENGINE_OPTIONS],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )


def marked_processes(mark: str, session: int | None = None) -> list:
    """The run's processes: those with its mark, and those of the CLI's ``session``."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARK) == mark or (session and os.getsid(process.pid) == session):
                found.append(process)
        except (psutil.Error, OSError):
            pass
    return found


def wait_for_no_processes(mark: str, timeout: float = 120.0) -> list:
    """Waits until no process of the run is left; returns those still there at the timeout."""
    deadline = time.monotonic() + timeout
    while (left := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Clips 1 and 4 transcribed (one of them through a file:// URI), clip 2 aligned to its text, and a
    file that is not audio; the clips' truth to check the words against."""
    folder = tmp_path_factory.mktemp("corpus")
    clips = sentence_clips()
    for index in (1, 2, 4):
        write_wav(folder / f"clip{index}.wav", clips[index].samples)
    (folder / "notes.wav").write_text("not audio " * 100)
    return folder, clips


def assert_words_match(result: dict, clip) -> None:
    """The result is this clip's: most of its words, each near its own time. Not a measure of boundaries
    (those are benchmarks/ and tests/engine's): the acoustic model places espeak-ng's words spoken one
    at a time between digital silences 0.3 s off now and then, and which ones moves with any change to
    its input (its known weakness on synthetic speech, docs/boundaries.md#an-acoustic-model-of-phones-
    2026-12-06; another dither pattern pulled "plays" 0.35 s into the pause before it), which a 0.2 s
    check read as someone else's words."""
    assert (start_errors(clip, result["words"]) <= 0.5).mean() >= 0.75, result["text"]


def test_a_killed_job_resumes_without_redoing_anything_and_fails_only_the_bad_item(corpus, tmp_path):
    """The job end to end: transcriptions (one through a file:// URI with its own language), a forced
    alignment and a file that is not audio. SIGKILL the job's process group once the first results are
    written; the rerun does the rest: every id once, the files written before the kill untouched, none
    processed by both runs, the bad item failed alone (exit 1), results 0644 under umask 022. (One
    test, not two: each run of the job starts Ray and an engine, about a minute of the suite.)"""
    folder, clips = corpus
    sources = ["clip1.wav", "clip4.wav"]  # transcribed well by tiny.en (as in test_cli)
    entries = [{"id": f"item{n}", "audio": sources[n % 2]} for n in range(8)]
    entries[4:4] = [
        {"id": "by uri", "audio": (folder / "clip4.wav").as_uri(), "language": "en"},
        {"id": "aligned", "audio": "clip2.wav", "text": clips[2].text},
        {"id": "broken", "audio": "notes.wav"},
    ]
    ids = [entry["id"] for entry in entries]
    ok_ids = [item_id for item_id in ids if item_id != "broken"]
    manifest = write_manifest(folder / "resume.jsonl", entries)
    out = tmp_path / "out"
    args = ("--manifest", str(manifest), "--output-dir", str(out), "--batch-size", "1")
    first_mark = uuid.uuid4().hex
    first = start_cli(*args, mark=first_mark, umask=0o022)
    deadline = time.monotonic() + 600
    while not list(out.glob("*.json")):
        assert first.poll() is None, first.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no result within 10 minutes"
        time.sleep(0.1)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    left = wait_for_no_processes(first_mark)
    assert not left, f"processes outlived the kill: {[(p.pid, p.name()) for p in left]}"
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("*.json")}
    assert 0 < len(before) < len(ok_ids), f"the kill was not halfway: {sorted(before)}"

    second_mark = uuid.uuid4().hex
    second = start_cli(*args, mark=second_mark, umask=0o022)
    stdout, stderr = second.communicate(timeout=600)
    assert second.returncode == 1, stderr[-3000:]  # one item failed; the job went on
    assert stdout == ""
    todo = len(ids) - len(before)
    assert f"{len(before)} done before, {todo} to do" in stderr, stderr[-3000:]
    tally = f"{todo}/{todo} items ({todo - 1} ok, 1 failed; {len(before)} done before)"
    assert tally in stderr, stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == sorted([*(f"{i}.json" for i in ok_ids), "summary.jsonl"])
    assert {oct(path.stat().st_mode & 0o777) for path in out.iterdir()} == {oct(0o644)}  # umask 022
    after = {name: (out / name).stat() for name in before}
    assert {name: (s.st_ino, s.st_mtime_ns) for name, s in after.items()} == before  # untouched
    rows = job.read_summary(out / "summary.jsonl")
    runs = list(dict.fromkeys(row["run"] for row in rows))
    assert len(runs) <= 2
    processed_by_second = {row["id"] for row in rows if row["run"] == runs[-1] and not row.get("recovered")}
    assert processed_by_second == set(ids) - {name.removesuffix(".json") for name in before}
    ok_rows = [row["id"] for row in rows if row["status"] == "ok"]
    assert sorted(ok_rows) == sorted(ok_ids), rows  # one ok row per id: read back for a row the kill cut
    latest = job.latest_status(rows)
    assert latest["broken"]["status"] == "error", latest["broken"]
    assert "notes.wav" in latest["broken"]["error"] and "AudioError" in latest["broken"]["error"]
    assert not wait_for_no_processes(second_mark), "processes of the job outlived it"

    for n, entry in enumerate(e for e in entries if e["id"].startswith("item")):
        assert_words_match(json.loads((out / f"{entry['id']}.json").read_text()), clips[(1, 4)[n % 2]])
    by_uri = json.loads((out / "by uri.json").read_text())
    assert_words_match(by_uri, clips[4])
    assert set(by_uri) >= {"task", "language", "duration", "text", "segments", "words"}  # verbose_json
    aligned = json.loads((out / "aligned.json").read_text())
    assert [w["word"].strip() for w in aligned["words"]] == clips[2].text.split()
    assert all(w["aligned"] for w in aligned["words"])
    assert latest["aligned"]["words"] == len(clips[2].words)
    assert latest["item0"]["audio_seconds"] == pytest.approx(clips[1].duration, abs=1e-3)


def directory_state(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every name in ``folder`` (temporary files too), with its inode, mtime and size."""
    return {
        entry.name: (entry.inode(), entry.stat().st_mtime_ns, entry.stat().st_size)
        for entry in os.scandir(folder)
    }


def writes_during(folder: Path, before: dict, seconds: float) -> dict[str, float]:
    """Names that appear or change in ``folder`` within ``seconds``, with when (one that goes is no write)."""
    started, written = time.monotonic(), {}
    while (now := time.monotonic()) - started < seconds:
        with contextlib.suppress(FileNotFoundError):  # a temporary file renamed while looked at
            for name, state in directory_state(folder).items():
                if before.get(name) != state:
                    written.setdefault(name, round(now - started, 2))
        time.sleep(0.02)
    return written


def describe(processes: list) -> list[str]:
    import psutil

    names = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            name = process.name()
            if name.startswith("python"):  # which python: its command line says
                name += f" ({' '.join(process.cmdline())[:160]})"
            names.append(f"{process.pid} {name}")
    return names


def test_a_killed_driver_leaves_nothing_running_and_writes_nothing_after(corpus, tmp_path):
    """SIGKILL the driver alone (not its process group) once the first result is there: from then on no
    file appears or changes in the output folder, and 15 s later no process of the job is left (Ray's
    gcs_server, raylet, agents and workers, the engine). Run under umask 027: results are 0640, as the
    summary is."""
    import psutil

    folder, _ = corpus
    sources = ["clip1.wav", "clip4.wav"]
    # More items than the job can finish before the census and the kill (16 once finished first: the
    # census then found no process at all, or only Ray's, as the job was shutting down).
    entries = [{"id": f"item{n}", "audio": sources[n % 2]} for n in range(400)]
    manifest = write_manifest(folder / "kill.jsonl", entries)
    out, mark = tmp_path / "out", uuid.uuid4().hex
    args = ("--manifest", str(manifest), "--output-dir", str(out), "--batch-size", "1")
    driver = start_cli(*args, mark=mark, umask=0o027)
    deadline = time.monotonic() + 600
    while not list(out.glob("item*.json")):
        assert driver.poll() is None, driver.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no result within 10 minutes"
        time.sleep(0.05)
    # The census must see every kind of process the job runs, or "none left" below proves nothing; it
    # looks again for a while (a process may not have taken its name yet; a loaded machine is slow).
    # The engine: vLLM titles it "VLLM::EngineCore" (the kernel keeps 15 characters, "EngineCor"), but in
    # CI it was once still "python" 30 s after the first result; its spawn command line names it too.
    expected = (
        "gcs_server",
        "raylet",
        "DashboardAgent",
        "RuntimeEnvAgent",
        "ray::MapWorker",
        "EngineCor|spawn_main",
    )
    census = time.monotonic() + 30
    while True:
        assert driver.poll() is None, "the job ended before it could be killed"
        running = " ".join(describe(marked_processes(mark, driver.pid)))
        missing = [kind for kind in expected if not any(name in running for name in kind.split("|"))]
        if not missing:
            break
        assert time.monotonic() < census, f"{missing} not seen among the job's processes: {running}"
        time.sleep(0.5)
    before = directory_state(out)
    os.kill(driver.pid, signal.SIGKILL)
    killed = time.monotonic()
    driver.wait()  # reaped, as a shell would (its pipes stay open while anything of the job holds them)
    written = writes_during(out, before, 5.0)
    time.sleep(max(0.0, killed + 15 - time.monotonic()))
    left = marked_processes(mark, driver.pid)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    modes = {path.name: oct(path.stat().st_mode & 0o777) for path in out.iterdir()}
    stderr = driver.stderr.read()[-2000:]  # the CLI's and the reaper's (a traceback, if it failed)
    problems = [
        f"written after the kill (s after it): {written}" if written else "",
        f"alive 15 s after the kill: {describe(left)}; stderr: {stderr}" if left else "",
        f"modes under umask 027: {modes}" if set(modes.values()) != {oct(0o640)} else "",
    ]
    assert not any(problems), "; ".join(filter(None, problems))
