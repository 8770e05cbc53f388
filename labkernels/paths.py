"""Where things live. The repository root is found from this file, or LABKERNELS_ROOT."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = Path(os.environ.get("LABKERNELS_ROOT", PACKAGE_DIR.parent)).resolve()
DATA_DIR = REPO_ROOT / "data"
MODELS_DIR = DATA_DIR / "models"
CACHE_DIR = DATA_DIR / "cache"
REPORTS_DIR = REPO_ROOT / "reports"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
KERNELS_DIR = PACKAGE_DIR / "kernels"
