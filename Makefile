# Every target creates .venv/ (and installs what it needs) on first use: see scripts/bootstrap.
.PHONY: serve test demo bench venv

PY := .venv/bin/python
PORT ?= 8000

venv:
	@scripts/bootstrap

serve: venv
	.venv/bin/vllm-whisper-align serve --port $(PORT)

test: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q

demo: venv
	.venv/bin/vllm-whisper-align transcribe vllm_whisper_align/assets/sample.flac --word-timestamps --format verbose_json

bench: venv
	$(PY) benchmarks/run.py
