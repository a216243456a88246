"""``vllm-whisper-align transcribe | align | serve | convert-ct2``.

Options this CLI does not know (``--dtype``, ``--max-num-seqs``, ``--enforce-eager``…) go to vLLM's
own engine-argument parser, so every engine setting works as it does for ``vllm serve``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from vllm_whisper_align.formats import RESPONSE_FORMATS



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-whisper-align", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    transcribe = commands.add_parser("transcribe", help="transcribe audio files (optionally with word times)")
    transcribe.add_argument("audio", nargs="+", help="audio files (wav, flac, mp3, ogg, m4a, ...)")
    _add_common(transcribe)
    transcribe.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    transcribe.add_argument("--word-timestamps", action="store_true", help="add word-level times")
    transcribe.add_argument("--prompt", default=None, help="text to condition the decoder on")

    align = commands.add_parser("align", help="forced alignment of known text to audio")
    align.add_argument("audio", nargs="?", help="one audio file, any length")
    source = align.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text spoken in AUDIO")
    source.add_argument("--text-file", type=Path, help="file holding the text spoken in AUDIO")
    source.add_argument("--manifest", type=Path, help='JSON lines: {"audio": PATH, "text": TEXT}')
    _add_common(align)

    serve = commands.add_parser("serve", help="start vLLM's OpenAI server with word timestamps")
    serve.add_argument("model", nargs="?", default=None, help="model (default: bundled tiny.en)")

    convert = commands.add_parser("convert-ct2", help="convert a CTranslate2 Whisper model to HF format")
    convert.add_argument("src", type=Path, nargs="+", help="CT2 model dir, or model.bin parts in order")
    convert.add_argument("dst", type=Path, help="output directory")
    return parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF Whisper dir/id or CT2 dir (default: tiny.en)")
    parser.add_argument("--language", default=None, help="language code (default: detect)")
    parser.add_argument("--format", choices=RESPONSE_FORMATS, default="verbose_json")
    parser.add_argument("--output-dir", type=Path, default=None, help="write <stem>.<ext> files here")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["serve"]:
            # Everything but the optional MODEL goes to vLLM's server parser untouched: argparse
            # would take an option's value (`--port 8000`) for MODEL.
            model = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
            return _serve(model, argv[2:] if model else argv[1:])
        else:
            own_argv, engine_argv = _split_engine_options(argv, _own_options(parser))
            args = parser.parse_args(own_argv)
        if args.command == "convert-ct2":
            return _convert(args)
        engine_args = _engine_args(engine_argv)
        if args.command == "transcribe":
            return _transcribe(args, engine_args)
        return _align(args, engine_args)
    except (ValueError, OSError) as error:
        print(f"vllm-whisper-align: error: {_one_line(error)}", file=sys.stderr)
        return 2


def _own_options(parser: argparse.ArgumentParser) -> set[str]:
    options = set(parser._option_string_actions)
    for action in parser._subparsers._group_actions:
        for subparser in action.choices.values():
            options |= set(subparser._option_string_actions)
    return options


def _split_engine_options(argv: list[str], own: set[str]) -> tuple[list[str], list[str]]:
    """Separate vLLM engine options (and their values) from this CLI's own arguments.

    Done before parsing, because argparse would hand the value of an option it does not know
    (``--dtype float32``) to an optional positional such as ``align``'s AUDIO.
    """
    own_argv, engine_argv = [], []
    engine_parser = None
    index = 0
    while index < len(argv):
        token = argv[index]
        name = token.split("=", 1)[0]
        if not token.startswith("--") or name in own:
            own_argv.append(token)
            index += 1
            continue
        engine_parser = engine_parser or _engine_parser()
        action = engine_parser._option_string_actions.get(name.replace("_", "-"))
        if action is None:
            raise ValueError(f"unknown option {name} (not this CLI's, not a vLLM engine option)")
        takes_value = action.nargs != 0 and "=" not in token
        engine_argv += argv[index : index + 1 + takes_value]
        index += 1 + takes_value
    return own_argv, engine_argv


def _engine_parser():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return EngineArgs.add_cli_args(FlexibleArgumentParser(prog="vllm-whisper-align (engine options)"))


def _engine_args(argv: list[str]) -> dict[str, Any]:
    """Parse the engine options with vLLM's own parser; keep only those the user set."""
    if not argv:
        return {}
    parser = _engine_parser()
    defaults = vars(parser.parse_args([]))
    given = vars(parser.parse_args(argv))
    return {k: v for k, v in given.items() if v != defaults.get(k) and k != "model"}


def _transcribe(args: argparse.Namespace, engine_args: dict[str, Any]) -> int:
    from vllm_whisper_align.audio import AudioError, decode_audio

    decoded, failures = [], 0
    for path in args.audio:
        try:
            decoded.append((path, decode_audio(path)))
        except AudioError as error:
            print(f"vllm-whisper-align: {path}: {_one_line(error)}", file=sys.stderr)
            failures += 1
    if decoded:
        aligner = _aligner(args.model, engine_args)
        results = aligner.transcribe(
            [samples for _, samples in decoded],
            language=args.language,
            task=args.task,
            word_timestamps=args.word_timestamps,
            prompt=args.prompt,
            use_tqdm=len(decoded) > 1,
        )
        for (path, _), result in zip(decoded, results):
            _emit(path, result, args, "word" if args.word_timestamps else "segment")
    return 1 if failures else 0


def _align(args: argparse.Namespace, engine_args: dict[str, Any]) -> int:
    from vllm_whisper_align.audio import AudioError, decode_audio
    from vllm_whisper_align.decoding import AlignmentInputError

    items = _alignment_items(args)
    aligner = None
    failures = 0
    for path, text in items:
        try:
            samples = decode_audio(path)
            aligner = aligner or _aligner(args.model, engine_args)
            result = aligner.align([samples], [text], language=args.language)[0]
        except (AudioError, AlignmentInputError) as error:
            print(f"vllm-whisper-align: {path}: {_one_line(error)}", file=sys.stderr)
            failures += 1
            continue
        _emit(path, result, args, "word")
    return 1 if failures else 0


def _alignment_items(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.manifest is not None:
        items = []
        for number, line in enumerate(args.manifest.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                items.append((str(entry["audio"]), str(entry["text"])))
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise ValueError(f"{args.manifest}:{number}: need {{\"audio\": ..., \"text\": ...}} ({error})")
        return items
    if args.audio is None:
        raise ValueError("align needs an AUDIO file (or --manifest)")
    text = args.text if args.text is not None else args.text_file.read_text()
    return [(args.audio, text)]


def _aligner(model: str | None, engine_args: dict[str, Any]):
    from vllm_whisper_align.offline import WhisperAligner

    return WhisperAligner(model, **engine_args)


def _emit(path: str, result: dict[str, Any], args: argparse.Namespace, granularity: str) -> None:
    from vllm_whisper_align.formats import EXTENSIONS, write_result

    text = write_result(result, args.format, granularity)
    if args.output_dir is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    args.output_dir.mkdir(parents=True, exist_ok=True)
    target = args.output_dir / f"{Path(path).stem}.{EXTENSIONS[args.format]}"
    target.write_text(text)
    print(f"wrote {target}", file=sys.stderr)


def _convert(args: argparse.Namespace) -> int:
    from vllm_whisper_align.checkpoints import convert_ct2_to_hf

    src = args.src[0] if len(args.src) == 1 else args.src
    out = convert_ct2_to_hf(src, args.dst)
    print(out)
    return 0


def _serve(model_name: str | None, server_argv: list[str]) -> int:
    from vllm_whisper_align.checkpoints import resolve_model

    model = resolve_model(model_name)
    defaults = _serve_defaults(server_argv)
    env = dict(os.environ)
    plugins = [p for p in env.get("VLLM_PLUGINS", "").split(",") if p]
    env["VLLM_PLUGINS"] = ",".join(dict.fromkeys([*plugins, "whisper-align"]))
    env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    command += defaults + server_argv
    os.execvpe(sys.executable, command, env)
    return 0


def _serve_defaults(server_argv: list[str]) -> list[str]:
    from vllm.platforms import current_platform

    from vllm_whisper_align.offline import PARALLEL_SIZE_ARGS, set_cpu_environment

    defaults = []
    if current_platform.is_cpu():
        long_flags = ["--" + name.replace("_", "-") for name in PARALLEL_SIZE_ARGS]
        parallel_flags = {*long_flags, "-tp", "-pp", "-dp"}
        set_cpu_environment(single_worker=not any(a.split("=")[0] in parallel_flags for a in server_argv))
        if not any(a.startswith("--gpu-memory-utilization") for a in server_argv):
            defaults += ["--gpu-memory-utilization", "0.5"]
    return defaults


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
