"""``vllm-whisper-align transcribe | align | stream | batch | serve | convert-ct2``.

Options this CLI does not know (``--dtype``, ``--max-num-seqs``, ``--enforce-eager``…) go to vLLM's
own engine-argument parser, so every engine setting works as it does for ``vllm serve``.

stdout carries the results and nothing else (``> out.json``, ``| jq``): logs go to stderr, and vLLM's
only with ``--verbose``. ``serve`` keeps vLLM's own logging.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging.config
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_whisper_align.errors import InputError
from vllm_whisper_align.formats.responses import RESPONSE_FORMATS
from vllm_whisper_align.memory import hide_triton_without_cpu_backend
from vllm_whisper_align.options import (
    ALIGNMENT_OPTIONS,
    LINE_OPTIONS,
    TRANSCRIPTION_OPTIONS,
    AlignmentOptions,
    Option,
    SubtitleOptions,
    TranscriptionOptions,
    echo,
)

if TYPE_CHECKING:
    from vllm_whisper_align.align.results import Transcript

# Before vLLM is imported, in this process and in the engine processes vLLM spawns from it, which
# run the main module (the console script, or this one under -m) again first: see memory.
hide_triton_without_cpu_backend()

# What transcribe and align write unless --format says otherwise (align --subtitles: the file's format).
DEFAULT_FORMAT = "verbose_json"
# The commands that run an engine here, whose logging the CLI sets up.
ENGINE_COMMANDS = ("transcribe", "align", "stream", "batch")
# vLLM's handler writes to stdout by default, where the results go.
LOG_STREAM = "ext://sys.stderr"
# The one line that reports a Ray error is cut to this.
MAX_ERROR_CHARS = 400
# Environment variables that say the user set up vLLM's logging: then the CLI does not quieten it.
USER_LOGGING_SETTINGS = ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-whisper-align", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    transcribe = commands.add_parser("transcribe", help="transcribe audio files (optionally with word times)")
    transcribe.add_argument("audio", nargs="+", help="audio files (wav, flac, mp3, ogg, m4a, ...)")
    _add_common(transcribe, ())
    transcribe.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    transcribe.add_argument("--word-timestamps", action="store_true", help="add word-level times")
    transcribe.add_argument("--prompt", default=None, help="text to condition the decoder on")
    _add_options(
        transcribe.add_argument_group("decoding (openai-whisper's and vLLM's)"), TRANSCRIPTION_OPTIONS
    )

    align = commands.add_parser("align", help="forced alignment of known text to audio")
    align.add_argument("audio", nargs="?", help="one audio file, any length")
    source = align.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text spoken in AUDIO")
    source.add_argument("--text-file", type=Path, help="file holding the text spoken in AUDIO")
    source.add_argument("--manifest", type=Path, help='JSON lines: {"audio": PATH, "text": TEXT}')
    source.add_argument(
        "--subtitles",
        type=Path,
        help="SRT or WebVTT file of AUDIO to re-time: every cue "
        "keeps its number and text and gets new times (written in its format by default)",
    )
    _add_common(align, ALIGNMENT_OPTIONS)

    stream = commands.add_parser(
        "stream", help="live word timestamps: each word printed as it is confirmed, while the audio plays"
    )
    stream.add_argument(
        "audio",
        help="an audio file (played at real time: see --speed), or - for raw PCM16 16 kHz mono on stdin",
    )
    stream.add_argument("--server", default=None, help="a server's URL (default: an engine in this process)")
    stream.add_argument(
        "--model", default=None, help="the model (in-process: HF dir/id or CT2 dir; default tiny.en)"
    )
    stream.add_argument("--language", default=None, help="language code (default: detect)")
    stream.add_argument("--prompt", default=None, help="text to condition the first decode on")
    stream.add_argument(
        "--speed", type=float, default=1.0, help="times real time a file is played at (default 1; 0: at once)"
    )
    stream.add_argument(
        "--jsonl",
        action="store_true",
        help="one JSON object a word (word, start, end, probability, confidence)",
    )
    _add_options(stream.add_argument_group("decoding (openai-whisper's and vLLM's)"), TRANSCRIPTION_OPTIONS)
    stream.add_argument("--verbose", action="store_true", help="vLLM's log (on stderr)")

    batch = commands.add_parser(
        "batch", help="a corpus job on Ray: every item of a manifest to OUTPUT_DIR/<id>.json, resumable"
    )
    batch.add_argument(
        "--manifest",
        type=Path,
        required=True,
        help='JSON lines: {"id": ID, "audio": PATH '
        'or URI} and optionally "text" (forced alignment) and "language"',
    )
    batch.add_argument(
        "--output-dir",
        type=Path,
        required=True,
        help="<id>.json per item and summary.jsonl; ids done there are skipped",
    )
    batch.add_argument("--ray-address", default=None, help="a Ray cluster (default: start a local Ray)")
    batch.add_argument("--replicas", type=int, default=1, help="engines, one per Ray actor (default 1)")
    batch.add_argument(
        "--cpus-per-replica",
        type=float,
        default=1.0,
        help="Ray CPUs each replica reserves (default 1; the engine's threads are bound by its own settings)",
    )
    batch.add_argument(
        "--gpus-per-replica",
        type=float,
        default=0.0,
        help="GPUs each replica reserves (default 0; 1 on a GPU cluster)",
    )
    batch.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="items in a batch; a replica works on two "
        "batches at once, every item its own engine requests (default 64)",
    )
    batch.add_argument("--model", default=None, help="HF Whisper dir/id or CT2 dir (default: tiny.en)")
    batch.add_argument("--language", default=None, help="for items without one (default: detect)")
    _add_options(batch, ALIGNMENT_OPTIONS)
    batch.add_argument("--verbose", action="store_true", help="Ray's and vLLM's logs and progress bars")

    serve = commands.add_parser("serve", help="start vLLM's OpenAI server with word timestamps")
    serve.add_argument("model", nargs="?", default=None, help="model (default: bundled tiny.en)")

    convert = commands.add_parser("convert-ct2", help="convert a CTranslate2 Whisper model to HF format")
    convert.add_argument("src", type=Path, nargs="+", help="CT2 model dir, or model.bin parts in order")
    convert.add_argument("dst", type=Path, help="output directory")
    return parser


def _add_options(parser: Any, options: Sequence[Option]) -> None:
    """A flag per option (``--name-with-dashes``), parsed and checked by the option itself; unset
    flags stay None, so that only what the user gave reaches the options' defaults."""
    for option in options:
        if option.kind is bool:
            parser.add_argument(option.flag, action="store_true", default=None, help=option.help)
            continue
        default = "" if option.default is None else f" (default {option.default})"
        parser.add_argument(
            option.flag,
            type=_parser_of(option),
            default=None,
            metavar=option.name.upper(),
            help=option.help + default,
        )


def _parser_of(option: Option):
    def parse(raw: str) -> Any:
        try:
            return option.parse(raw)
        except InputError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = option.name  # argparse names the type in its message
    return parse


def _given(args: argparse.Namespace, options: Sequence[Option]) -> dict[str, Any]:
    return {
        option.name: getattr(args, option.name)
        for option in options
        if getattr(args, option.name) is not None
    }


def _add_common(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    parser.add_argument("--model", default=None, help="HF Whisper dir/id or CT2 dir (default: tiny.en)")
    parser.add_argument("--language", default=None, help="language code (default: detect)")
    parser.add_argument("--format", choices=RESPONSE_FORMATS, default=None, help=f"default {DEFAULT_FORMAT}")
    _add_options(parser, options)
    _add_options(parser.add_argument_group("subtitle lines (srt, vtt; as openai-whisper's)"), LINE_OPTIONS)
    parser.add_argument("--output-dir", type=Path, default=None, help="write <stem>.<ext> files here")
    parser.add_argument("--verbose", action="store_true", help="vLLM's log and progress bars (on stderr)")


def console_main() -> int:
    """The console script: ``main``, then every object of the process kept out of the collection Python
    runs as it exits. Traversing what vLLM, torch and pydantic leave behind took 2.6-2.9 s after the
    last result was out (py-spy: ``gc_collect_main`` in pydantic_core); the process is ending, and
    what it holds is given back with it. Not in ``main``, which a program may call and go on."""
    status = main()
    gc.freeze()
    return status


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["serve"]:
            # Everything but the optional MODEL goes to vLLM's server parser untouched: argparse
            # would take an option's value (`--port 8000`) for MODEL.
            model = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
            return _serve(model, argv[2:] if model else argv[1:])
        parser = build_parser()
        # Looked up before parsing: splitting off the engine options may import vLLM, which logs.
        runs_engine = bool(argv) and argv[0] in ENGINE_COMMANDS
        with _logging_once_vllm_comes("--verbose" in argv) if runs_engine else contextlib.nullcontext():
            return _run(parser, argv)
    except (ValueError, OSError) as error:  # InputError is a ValueError
        print(f"vllm-whisper-align: error: {_one_line(error)}", file=sys.stderr)
        return 2


def _run(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    own_argv, engine_argv = _split_engine_options(argv, _own_options(parser))
    args = parser.parse_args(own_argv)
    if args.command == "convert-ct2":
        return _convert(args)
    engine_args = _engine_args(engine_argv)
    if args.command == "stream" and args.server is not None:
        return _stream(args, engine_args)  # no engine here: engine options are a mistake
    # The checkpoint-loading progress bar is vLLM's too.
    engine_args.setdefault("use_tqdm_on_load", args.verbose)
    if args.command == "batch":
        return _batch(args, engine_args)
    if args.command == "stream":
        return _stream(args, engine_args)
    if args.command == "align" and args.subtitles is not None:
        return _retime(args, engine_args)
    args.format = args.format or DEFAULT_FORMAT
    if args.command == "transcribe":
        return _transcribe(args, engine_args)
    return _align(args, engine_args)


# Set by main for a command that may run an engine: sets up its logging (once) just before this process
# imports vLLM. None outside main: a caller of these functions has its own logging.
_vllm_coming: Callable[[], None] | None = None


@contextlib.contextmanager
def _logging_once_vllm_comes(verbose: bool) -> Iterator[None]:
    """``_logging_to_stderr``, entered only when ``_before_vllm`` is first called: a command that ends
    before then (a mistake in its arguments, a missing file, a client of a server) neither imports vLLM
    (seconds, for torch) nor waits for it."""
    global _vllm_coming
    with contextlib.ExitStack() as stack:
        entered: list[bool] = []

        def enter() -> None:
            if not entered:
                stack.enter_context(_logging_to_stderr(verbose))
                entered.append(True)

        _vllm_coming = enter
        try:
            yield
        finally:
            _vllm_coming = None


def _before_vllm() -> None:
    """Called before anything here imports vLLM or starts an engine."""
    if _vllm_coming is not None:
        _vllm_coming()


@contextlib.contextmanager
def _logging_to_stderr(verbose: bool) -> Iterator[None]:
    """vLLM's log on stderr; unless ``verbose``, only its errors, and our own warnings.

    Set up before vLLM is imported, in the environment, which the engine's processes inherit
    (restored on the way out, for a caller of main()). Logging the user configured for vLLM (a level,
    a config file, none at all) is left as it is.
    """
    saved_environment = dict(os.environ)
    try:
        os.environ["VLLM_LOGGING_STREAM"] = LOG_STREAM
        if verbose or any(name in os.environ for name in USER_LOGGING_SETTINGS):
            yield
        else:
            with _quiet_vllm():
                yield
    finally:
        os.environ.clear()
        os.environ.update(saved_environment)


@contextlib.contextmanager
def _quiet_vllm() -> Iterator[None]:
    """vLLM's loggers at ERROR, ours at WARNING: here, and through a config file in the engine's processes."""
    from vllm_whisper_align.log import quiet_logging_config

    config = quiet_logging_config(LOG_STREAM)
    logging.config.dictConfig(config)
    # Bypassing logging: PyTorch's C++ warnings (NUMA binding...), and the FutureWarnings of the
    # PyTorch APIs that vLLM calls, in vLLM's processes (the environment) and in this one.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if "PYTHONWARNINGS" not in os.environ:
        os.environ["PYTHONWARNINGS"] = "ignore::FutureWarning"
        warnings.filterwarnings("ignore", category=FutureWarning)
    with tempfile.NamedTemporaryFile("w", prefix="vllm-whisper-align-logging-", suffix=".json") as file:
        json.dump(config, file)
        file.flush()
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = file.name
        yield


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
    _before_vllm()
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
    from vllm_whisper_align.audio.decode import AudioError, decode_audio

    _check_output_names(args.audio, args)
    decoded, failures = [], 0
    for path in args.audio:
        try:
            decoded.append((path, decode_audio(path, spill=True)))
        except AudioError as error:
            print(f"vllm-whisper-align: {path}: {_one_line(error)}", file=sys.stderr)
            failures += 1
    if decoded:
        with _aligner(args.model, engine_args) as aligner:
            results = aligner.transcribe(
                [samples for _, samples in decoded],
                language=args.language,
                task=args.task,
                word_timestamps=args.word_timestamps,
                prompt=args.prompt,
                options=TranscriptionOptions.from_checked(_given(args, TRANSCRIPTION_OPTIONS)),
                use_tqdm=args.verbose and len(decoded) > 1,
            )
            for (path, _), result in zip(decoded, results, strict=True):
                _emit(path, result, args, "word" if args.word_timestamps else "segment")
    return 1 if failures else 0


def _stream(args: argparse.Namespace, engine_args: dict[str, Any]) -> int:
    """AUDIO (or stdin) streamed: to ``--server``'s /v1/realtime, or through an engine here; each word
    printed as it is confirmed."""
    from vllm_whisper_align.live.sources import played, stdin_chunks

    if not args.speed >= 0:  # NaN too, which played a file at once
        raise InputError(f"--speed must be 0 or more; got {args.speed:g}", "speed")
    options = _given(args, TRANSCRIPTION_OPTIONS)
    TranscriptionOptions.from_checked(options)  # their mistakes before anything starts
    if args.audio == "-":
        chunks = stdin_chunks(sys.stdin.buffer)
    else:
        from vllm_whisper_align.audio.decode import decode_audio

        chunks = played(decode_audio(args.audio), args.speed)
    if args.server is not None:
        from vllm_whisper_align.realtime_client import stream_to_server

        if engine_args:
            raise InputError(f"engine options do not apply to --server: {', '.join(engine_args)}", "server")
        session = {"language": args.language, "prompt": args.prompt, **options}
        session = {name: value for name, value in session.items() if value is not None}
        session.update({"model": args.model} if args.model else {})
        stream_to_server(args.server, chunks, lambda word: _print_word(word, args.jsonl), session)
        return 0
    with _aligner(args.model, engine_args) as aligner:
        from vllm_whisper_align.runners.live import stream_in_process

        stream_in_process(
            aligner,
            chunks,
            lambda update: [_print_word(word.to_dict(), args.jsonl) for word in update.confirmed],
            language=args.language,
            prompt=args.prompt,
            options=TranscriptionOptions.from_checked(options),
        )
    return 0


def _print_word(word: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(word, ensure_ascii=False), flush=True)
    else:
        print(f"{word['start']:8.2f} {word['end']:8.2f}  {word['word'].strip()}", flush=True)


def _align(args: argparse.Namespace, engine_args: dict[str, Any]) -> int:
    from vllm_whisper_align.audio.decode import decode_audio

    items = _alignment_items(args)
    _check_output_names([path for path, _ in items], args)
    options = AlignmentOptions(**_given(args, ALIGNMENT_OPTIONS))
    aligner = None
    failures = 0
    with contextlib.ExitStack() as engine:
        for path, text in items:
            try:
                # Any length: a long recording is aligned window by window, read back from a file.
                samples = decode_audio(path, spill=True)
                aligner = aligner or engine.enter_context(_aligner(args.model, engine_args))
                result = aligner.align([samples], [text], language=args.language, options=options)[0]
            except InputError as error:
                print(f"vllm-whisper-align: {path}: {_one_line(error)}", file=sys.stderr)
                failures += 1
                continue
            _emit(path, result, args, "word")
    return 1 if failures else 0


def _alignment_entry(entry: Any) -> tuple[str, str]:
    """(audio, text) of one manifest line: both strings (a null or a number is no text to align)."""
    if not isinstance(entry, dict):
        raise ValueError('need a JSON object {"audio": ..., "text": ...}')
    for key in ("audio", "text"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise ValueError(f'"{key}" must be a non-empty string; got {echo(entry.get(key))}')
    return entry["audio"], entry["text"]


def _alignment_items(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.manifest is not None:
        items = []
        for number, line in enumerate(args.manifest.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append(_alignment_entry(json.loads(line)))
            except (json.JSONDecodeError, ValueError) as error:
                raise ValueError(f"{args.manifest}:{number}: {error}") from None
        return items
    if args.audio is None:
        raise ValueError("align needs an AUDIO file (or --manifest)")
    text = args.text if args.text is not None else args.text_file.read_text()
    return [(args.audio, text)]


def _batch(args: argparse.Namespace, engine_args: dict[str, Any]) -> int:
    """``batch``: the manifest is checked and Ray looked for before anything starts (see ``batch``)."""
    from vllm_whisper_align.batch.job import JobOptions, read_manifest
    from vllm_whisper_align.batch.on_ray import require_ray, run_job

    for name in ("replicas", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    items = read_manifest(args.manifest)
    require_ray()
    _before_vllm()  # the job's processes inherit its settings
    method = _given(args, ALIGNMENT_OPTIONS).get("alignment_method")
    options = JobOptions(str(args.output_dir.absolute()), args.language, method)
    try:
        report = run_job(
            items,
            args.output_dir,
            model=args.model,
            engine_args=engine_args,
            options=options,
            ray_address=args.ray_address,
            replicas=args.replicas,
            cpus_per_replica=args.cpus_per_replica,
            gpus_per_replica=args.gpus_per_replica,
            batch_size=args.batch_size,
            verbose=args.verbose,
        )
    except (ValueError, OSError):
        raise
    except Exception as error:  # Ray's (a replica that cannot start, a lost cluster): one line, exit 2
        # A Ray error's text is a remote traceback: its last line is the cause
        lines = [line for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
        message = _one_line(Exception(lines[-1]))[:MAX_ERROR_CHARS]
        raise ValueError(f"the job stopped (rerun it to resume): {message}") from None
    return report.exit_status


def _retime(args: argparse.Namespace, engine_args: dict[str, Any]) -> int:
    """``align AUDIO --subtitles FILE``: FILE's cues with new times from AUDIO (see ``retiming``)."""
    from vllm_whisper_align.audio.decode import decode_audio
    from vllm_whisper_align.formats import retiming
    from vllm_whisper_align.formats.responses import ALIGNMENT_FORMATS
    from vllm_whisper_align.formats.subtitles import read_subtitles

    if args.audio is None:
        raise ValueError("align --subtitles needs an AUDIO file")
    if not _subtitle_options(args).is_default:
        raise ValueError("line controls do not apply to --subtitles: its cues keep their lines")
    try:  # before the engine starts: a bad file fails in a moment
        subtitles = read_subtitles(args.subtitles.read_bytes())
        text = retiming.alignment_text(subtitles.cues)
    except ValueError as error:
        raise ValueError(f"{args.subtitles}: {error}") from None
    fmt = args.format or subtitles.format
    if fmt not in ALIGNMENT_FORMATS:
        raise ValueError(f"--subtitles writes {', '.join(ALIGNMENT_FORMATS)}; not {fmt}")
    try:
        samples = decode_audio(args.audio, spill=True)
        with _aligner(args.model, engine_args) as aligner:
            options = AlignmentOptions(**_given(args, ALIGNMENT_OPTIONS))
            result = aligner.align([samples], [text], language=args.language, options=options)[0]
    except InputError as error:
        print(f"vllm-whisper-align: {args.audio}: {_one_line(error)}", file=sys.stderr)
        return 1
    _write(args.audio, retiming.render(retiming.retime(subtitles, result), result, fmt), fmt, args)
    return 0


def _aligner(model: str | None, engine_args: dict[str, Any]):
    _before_vllm()
    from vllm_whisper_align.runners.offline import WhisperAligner

    return WhisperAligner(model, **engine_args)


def _emit(path: str, result: Transcript, args: argparse.Namespace, granularity: str) -> None:
    from vllm_whisper_align.formats.responses import write_result

    text = write_result(result, args.format, granularity, _subtitle_options(args))
    _write(path, text, args.format, args)


def _output_path(path: str, fmt: str, args: argparse.Namespace) -> Path:
    """Where ``--output-dir`` gets the result of input PATH: its stem with ``fmt``'s extension."""
    from vllm_whisper_align.formats.responses import EXTENSIONS

    return args.output_dir / f"{Path(path).stem}.{EXTENSIONS[fmt]}"


def _check_output_names(paths: Sequence[str], args: argparse.Namespace) -> None:
    """Refuse, before anything runs, inputs whose results would overwrite each other in ``--output-dir``
    (``a/clip.wav`` and ``b/clip.wav`` are both ``clip.json``)."""
    if args.output_dir is None:
        return
    first: dict[Path, str] = {}
    for path in paths:
        target = _output_path(path, args.format, args)
        if target in first:
            raise ValueError(
                f"{first[target]} and {path} would both be written to {target}: give inputs of different "
                "names, or run them with different --output-dir"
            )
        first[target] = path


def _write(path: str, text: str, fmt: str, args: argparse.Namespace) -> None:
    """``text`` to stdout, or to ``--output-dir`` (``_output_path``)."""
    if args.output_dir is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    args.output_dir.mkdir(parents=True, exist_ok=True)
    target = _output_path(path, fmt, args)
    target.write_text(text)
    print(f"wrote {target}", file=sys.stderr)


def _subtitle_options(args: argparse.Namespace) -> SubtitleOptions:
    return SubtitleOptions(**_given(args, LINE_OPTIONS))


def _convert(args: argparse.Namespace) -> int:
    from vllm_whisper_align.checkpoints.ct2 import convert_ct2_to_hf

    src = args.src[0] if len(args.src) == 1 else args.src
    out = convert_ct2_to_hf(src, args.dst)
    print(out)
    return 0


def _serve(model_name: str | None, server_argv: list[str]) -> int:
    from vllm_whisper_align.engine.vllm_internals import front_end_without_plugins

    unsupported = front_end_without_plugins(server_argv, os.environ)
    if unsupported:  # before anything imports vLLM: a refusal in a moment
        raise ValueError(
            f"{unsupported}, which does not load this plugin's endpoints (no word timestamps, "
            "no /v1/audio/alignments); serve through vLLM's HTTP server"
        )
    check_plugin_options(server_argv)
    from vllm_whisper_align.checkpoints.bundled import resolve_model
    from vllm_whisper_align.log import vllm_logging_now
    from vllm_whisper_align.server.limits import http_environment

    vllm_logging_now()  # the defaults' line comes before vLLM's server configures logging
    model = resolve_model(model_name)
    defaults, server_argv, engine_env = _serve_defaults(model_name, model, server_argv)
    env = {**os.environ, **engine_env, **http_environment()}
    plugins = [p for p in env.get("VLLM_PLUGINS", "").split(",") if p]
    env["VLLM_PLUGINS"] = ",".join(dict.fromkeys([*plugins, "whisper-align"]))
    # Our module runs vLLM's own serve command (see engine.vllm_internals.run_vllm_serve): --headless and
    # --api-server-count work as they do for `vllm serve`.
    command = [sys.executable, "-m", "vllm_whisper_align.server.launch", "--model", model]
    command += defaults + server_argv
    os.execvpe(sys.executable, command, env)


def check_plugin_options(server_argv: list[str]) -> None:
    """The plugin's own options (``--additional-config``'s ``whisper_align``), read before vLLM starts:
    a mistake there is one line now, not an engine core that fails to start with a traceback after
    tens of seconds. Given as JSON or dotted (``--additional-config.whisper_align.packing false``,
    which vLLM's parser gathers into one JSON object); text that is not JSON is left to vLLM's parser,
    which says so."""
    from vllm_whisper_align.protocol import WhisperAlignConfig

    dotted: dict = {}
    for i, arg in enumerate(server_argv):
        name, equals, value = arg.partition("=")
        if not equals and i + 1 < len(server_argv):
            value = server_argv[i + 1]
        if name == "--additional-config":
            try:
                config = json.loads(value)
            except json.JSONDecodeError:
                continue
            if isinstance(config, dict):
                WhisperAlignConfig.from_additional_config(config)
        elif name.startswith("--additional-config."):
            _set_dotted(dotted, name.split(".")[1:], value)
    if dotted:
        WhisperAlignConfig.from_additional_config(dotted)


def _set_dotted(config: dict, keys: list[str], value: str) -> None:
    """``config`` with ``value`` at ``keys``, as vLLM's parser reads a dotted argument (the value as JSON
    where it is JSON, else the text itself)."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        parsed = value
    for key in keys[:-1]:
        if not isinstance(config.get(key), dict):
            config[key] = {}
        config = config[key]
    config[keys[-1]] = parsed


def _serve_defaults(
    model_name: str | None, model: str, server_argv: list[str]
) -> tuple[list[str], list[str], dict[str, str]]:
    """The engine flags the user did not give, the user's own flags to pass after them, and the
    environment the server must start with.

    Decided by engine.settings, as for the offline API; the served name is the model's name, not
    the path it was resolved to. A ``--dtype auto`` the user wrote is left out of their flags: it
    asks for the default (``engine.settings.user_choices``), which the defaults then carry.
    """
    import argparse

    from vllm_whisper_align.engine.settings import (
        VLLM_DEFAULT_DTYPE,
        engine_environment,
        engine_settings,
        served_model_name,
        user_choices,
    )

    parser = _engine_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS  # so that only options the user wrote come back
    written = vars(parser.parse_known_args(server_argv)[0])
    given = user_choices(written)
    if "dtype" in written and "dtype" not in given:
        server_argv = _without_option(server_argv, "--dtype", VLLM_DEFAULT_DTYPE)
    settings = engine_settings(model, given)
    if "served_model_name" not in given:
        settings["served_model_name"] = served_model_name(model_name)
    flags = []
    for name, value in settings.items():
        flag = name.replace("_", "-")
        if isinstance(value, bool):  # vLLM's boolean options take no value: --enforce-eager, --no-...
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            flags += [f"--{flag}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return flags, server_argv, engine_environment(given)


def _without_option(argv: list[str], option: str, value: str) -> list[str]:
    """``argv`` less ``option value`` and ``option=value``."""
    kept: list[str] = []
    rest = iter(argv)
    for arg in rest:
        if arg == f"{option}={value}":
            continue
        if arg == option:
            following = next(rest, None)
            if following == value:
                continue
            kept += [arg] if following is None else [arg, following]
            continue
        kept.append(arg)
    return kept


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


if __name__ == "__main__":
    sys.exit(console_main())
