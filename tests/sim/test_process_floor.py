"""What a replay process imports and decorates before it runs (issue 34: the per-process
floor of a warm 1-replica closed loop; docs/benchmarks.md, "Per-process floor")."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _fresh(code: str) -> list:
    """Run ``code`` in a fresh interpreter; the JSON it printed last on stderr."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ), timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stderr.strip().splitlines()[-1])


def test_sealing_the_replay_imports_no_single_tier_simulator():
    """``seal_all`` (run before any compiled replay code loads) imports the replay's compiled
    modules only: the single-tier simulator and its loops (~7 ms of imports and numba
    decorations) are for their own users."""
    loaded = _fresh("import sys, json\n"
                    "from kvsim.jit.disk_cache import COMPILED, seal_all\n"
                    "seal_all()\n"
                    "assert all(m in sys.modules for m in COMPILED)\n"
                    "print(json.dumps(sorted(m for m in sys.modules "
                    "if m.startswith('kvsim.cachesim'))), file=sys.stderr)\n")
    assert loaded == []
