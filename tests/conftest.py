"""Shared test set-up: keep every test's files and datasets inside pytest's temporary folders."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

# Make sure no test ever reads or writes the user's real dataset folders.
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(autouse=True)
def _isolated_data_dirs(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("MBRL_DATA_DIR", str(root / "mbrl-datasets"))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root / "mbrl-datasets"))
    monkeypatch.setenv("MBRL_CACHE_DIR", str(root / "jax-cache"))  # `mbrl train` keeps compiles on disk


@pytest.fixture(scope="session")
def load_script():
    """Import `scripts/NAME.py` (scripts are not a package) and return the module."""

    def load(name):
        path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
