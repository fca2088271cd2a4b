"""Fixtures for the decision-log reader tests: the hand-made logs and their generator."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _load_make_logs():
    spec = importlib.util.spec_from_file_location("kvsim_test_make_logs", HERE / "make_logs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def make_logs():
    """The generator module (tests/log/make_logs.py): rows, table() and write()."""
    return _load_make_logs()


@pytest.fixture(scope="session")
def lru_path() -> Path:
    return HERE / "data" / "lru.log.parquet"


@pytest.fixture(scope="session")
def deadline_path() -> Path:
    return HERE / "data" / "deadline.log.parquet"


@pytest.fixture(autouse=True)
def _no_registry_explain(monkeypatch):
    """Explanations in these tests use the logged scores unless a test injects a policy
    explain(): the expected values must not change when a built-in policy gains one."""
    import kvsim.results.log_explain as log_explain

    monkeypatch.setattr(log_explain, "policy_explainer", lambda name: None)
