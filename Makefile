# Every target creates .venv/ (and installs what it needs) on first use: see scripts/bootstrap.
.PHONY: serve test test-fast lint demo bench bench-streaming bench-clips bench-flood venv

PY := .venv/bin/python
PORT ?= 8000

venv:
	@scripts/bootstrap

serve: venv
	.venv/bin/vllm-whisper-align serve --port $(PORT)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The whole suite: a real engine, a real server, the openai client, the CLI (about 23 minutes on a 2-core
# AMD EPYC, more on a busy machine); it ends with its 20 slowest tests, where the time goes.
test: lint
	$(PY) -m pytest -q --durations=20

# The pure tests only (tests/unit: no engine, no server), in a minute or two.
test-fast: lint
	$(PY) -m pytest -q tests/unit

demo: venv
	.venv/bin/vllm-whisper-align transcribe vllm_whisper_align/assets/sample.flac --word-timestamps --format verbose_json

bench: venv
	$(PY) benchmarks/run.py

# Live word timestamps on /v1/realtime (delays, WER against offline, streams held), a few minutes; under the
# exclusive lock, as every benchmark on a shared machine.
bench-streaming: venv
	flock -x /tmp/vwa-bench.lock $(PY) benchmarks/streaming_bench.py

# Short clips through serve, packed and unpacked, and faster-whisper beside them (about 15 minutes).
bench-clips: venv
	flock -x /tmp/vwa-bench.lock $(PY) benchmarks/clip_lengths.py

# A long file beside clients flooding serve with short clips: how long it is held back (about 10 minutes).
bench-flood: venv
	flock -x /tmp/vwa-bench.lock $(PY) benchmarks/flood_bench.py
