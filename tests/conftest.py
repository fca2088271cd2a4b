"""Shared fixtures.

``shared_traces`` points at ``../shared/traces`` (real public traces kept beside the repo,
never copied into it).  A user's fresh clone does not have that folder: tests that need it
skip with a clear reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    path = SHARED / "traces"
    if not path.is_dir():
        pytest.skip(f"real traces not found at {path} (they live in ../shared/traces beside "
                    "the repository; a plain clone does not have them)")
    return path


@pytest.fixture(scope="session")
def shared_formats() -> Path:
    path = SHARED / "formats"
    if not path.is_dir():
        pytest.skip(f"reference formats not found at {path} (../shared/formats beside the "
                    "repository)")
    return path
