"""Shared fixtures. GPU tests are marked ``gpu`` and skipped without a GPU; model tests need the real
Gemma GGUF (``labkernels model fetch``) and are skipped without it unless LABKERNELS_REQUIRE_MODEL=1."""
import os

import numpy as np
import pytest

from labkernels.model import default_model_path


MODEL_FIXTURES = {"model", "model_path"}


@pytest.hookimpl(tryfirst=True)   # before -m selects: `-m "not model"` deselects the tests marked here too
def pytest_collection_modifyitems(config, items):
    from labkernels.model import KQUANT_CACHE
    from labkernels.provenance import gpu_available

    has_gpu = gpu_available()
    has_tensors = default_model_path().exists() or KQUANT_CACHE.exists()
    require = os.environ.get("LABKERNELS_REQUIRE_MODEL") == "1"
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)      # a test that takes the real model carries the model mark
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU with cupy"))
        elif "model" in item.keywords and not has_tensors and not require:
            # a marked test that reads the real tensors itself (model.load_kquant: the GGUF or its tensor cache)
            item.add_marker(pytest.mark.skip(reason="real model tensors absent (labkernels model fetch)"))


@pytest.fixture(scope="session")
def model_path():
    p = default_model_path()
    if not p.exists():
        if os.environ.get("LABKERNELS_REQUIRE_MODEL") == "1":
            pytest.fail(f"real model required but missing: {p} (run `labkernels model fetch`)")
        pytest.skip(f"real model not fetched: {p}")
    return p


@pytest.fixture(scope="session")
def model(model_path):
    from labkernels.model import open_model

    return open_model(model_path)


@pytest.fixture
def rng(request):
    # fresh random inputs every run; the seed is printed so a failure can be replayed
    seed = int(os.environ.get("LABKERNELS_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"seed={seed}")
    return np.random.default_rng(seed)
