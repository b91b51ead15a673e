"""Test tiers: the CPU tier runs everywhere (CI); ``gpu`` tests skip cleanly without a device;
``slow`` (heavy fuzzing, every catalogue file through nvcc) runs only with --run-slow."""
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("cpu", max_examples=40, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile("gpu", max_examples=int(os.environ.get("CONVGEN_GPU_EXAMPLES", "60")), deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.load_profile("cpu")


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="run the heavy fuzzing tests")


def _gpu_available() -> bool:
    from codegen.api import has_gpu

    return has_gpu()


def pytest_collection_modifyitems(config, items):
    gpu = _gpu_available()
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU visible"))
        if "slow" in item.keywords and not config.getoption("--run-slow"):
            item.add_marker(pytest.mark.skip(reason="heavy (fuzzing, every catalogue file through nvcc): pass --run-slow"))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh on-disk kernel cache for one test."""
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
