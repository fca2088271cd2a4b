"""How a sweep knows what it has already computed: cells keyed by content.

A cell's key (:func:`cell_key`) is the SHA-256 of the trace's bytes, the policy (a user
policy file by its bytes), the replay configuration with every file it names replaced by
that file's content hash (``--hardware my.toml``, a tier policy from ``--policy-file``),
and :func:`code_fingerprint` (kvsim's version and the sources a result depends on).
Editing any of those files makes new cells; a renamed but identical file reuses them.

A sweep folder belongs to one trace (:func:`own_trace`, recorded in :data:`SWEEP_MARKER`):
another trace is refused in one line, or ``--force`` resets the folder's sweep outputs.
docs/sweep.md, "Cache".
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from kvsim import __version__
from kvsim.core.errors import KvsimInputError
from kvsim.spec.sim_config import SimConfig

#: Bumped when the row format changes (part of every cell key).  2: cells carry an
#: occupancy series (``cells/<key>.occupancy.parquet``).
ROW_FORMAT = 2

#: Sources a cell's result depends on (relative to the repository / package roots).
_FINGERPRINT_GLOBS = ("replay/*.py", "replay/kernel/*.py", "modes/*.py", "modes/*/*.py",
                      "bounds/*.py", "cachesim/*.py", "engine/*.py", "memory/*.py",
                      "policy/*.py", "jit/*.py", "events/*.py", "core/schema.py",
                      "spec/*.py", "spec/models/*.py", "spec/models/*.toml",
                      "analysis/sweep.py", "analysis/sweep_cell.py",
                      "analysis/sweep_keys.py")


def file_sha256(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    """SHA-256 of a file's bytes, read in chunks (constant memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            buf = fh.read(chunk_bytes)
            if not buf:
                break
            h.update(buf)
    return h.hexdigest()


def code_fingerprint() -> str:
    """SHA-256 over the sources a replay result depends on (paths and bytes, sorted), the
    built-in policies, the hardware profiles and the kvsim version."""
    import kvsim
    import kvsim.policies as builtin_policies
    import kvsim.profiles as profiles

    h = hashlib.sha256(f"kvsim {__version__} row {ROW_FORMAT}".encode())
    roots = [(Path(kvsim.__file__).parent, _FINGERPRINT_GLOBS),
             (Path(builtin_policies.__file__).parent, ("*.py",)),
             (Path(profiles.__file__).parent, ("hardware/*.toml",))]
    for root, globs in roots:
        files = sorted({p for g in globs for p in root.glob(g) if p.is_file()})
        for p in files:
            h.update(str(p.relative_to(root.parent)).encode() + b"\0")
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def _policy_identity(policy: str) -> str:
    """A name, or a user policy file's name plus the hash of its bytes; a name registered
    from a ``--policy-file`` carries that file's hash too (an edited file is a new cell)."""
    if policy.endswith(".py"):
        return f"file:{Path(policy).name}:{file_sha256(policy)}"
    from kvsim.policy.registry import _REGISTRY

    source = getattr(_REGISTRY.get(policy), "source", None)
    if source and Path(source).is_file():
        return f"{policy}:file:{file_sha256(source)}"
    return policy


def _content(value):
    """A config value with every file it names replaced by that file's content hash
    (``--hardware my.toml``, a tier policy registered from a file): cells are keyed by
    what the files hold, never by their path."""
    if isinstance(value, dict):
        return {k: _content(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_content(v) for v in value]
    if isinstance(value, str) and value:
        try:
            if Path(value).is_file():
                return f"file:{file_sha256(value)}"
        except (OSError, ValueError):
            return value
        return _policy_identity(value)
    return value


def _config_identity(config: SimConfig) -> dict:
    d = config.to_dict()
    for k in ("batch_rows", "log_lifecycle", "log_candidates"):  # cannot change a summary
        d.pop(k, None)
    return _content(d)


def cell_key(trace_sha256: str, policy: str, config: SimConfig, fingerprint: str) -> str:
    """Content key of a cell (hex SHA-256)."""
    payload = json.dumps({"trace": trace_sha256, "policy": _policy_identity(policy),
                          "config": _config_identity(config), "code": fingerprint},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


#: The file that marks a folder as a kvsim sweep folder (written by the first run); it
#: records the trace the folder belongs to (``trace_sha256 = ...``).
SWEEP_MARKER = ".kvsim-sweep"
#: What a sweep writes in its folder (removed by ``--force`` on another trace).
SWEEP_OUTPUTS = ("cells", "results.parquet", "summary.json", "occupancy.parquet",
                 "curves.parquet")


def own_trace(out_dir: Path, trace: str, trace_sha: str, force: bool) -> None:
    """A sweep folder belongs to one trace (by content): another trace is refused in one
    line, or with ``force`` the folder's sweep outputs are removed first (a clean reset:
    no cell, results or curves of the other trace survive)."""
    import shutil

    marker = out_dir / SWEEP_MARKER
    text = marker.read_text(encoding="utf-8") if marker.is_file() else ""
    recorded = dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line)
    old = recorded.get("trace_sha256")
    if old is None and (out_dir / "results.parquet").is_file():  # a folder from before
        try:
            old = str(pd.read_parquet(out_dir / "results.parquet",
                                      columns=["trace_sha256"])["trace_sha256"].iloc[0])
        except Exception:  # noqa: BLE001 - unreadable: treat as another trace's
            old = "unknown"
    if old is not None and old != trace_sha:
        if not force:
            raise KvsimInputError(
                f"expected a sweep folder of this trace: it holds the sweep of "
                f"{recorded.get('trace', 'another trace')} (sha256 {old[:12]}...), not of "
                f"{Path(trace).name} (sha256 {trace_sha[:12]}...); give another --out, or "
                "--force to reset the folder", out_dir, None, "--out")
        for name in SWEEP_OUTPUTS:
            target = out_dir / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
    marker.write_text(f"kvsim sweep folder\ntrace = {Path(trace).name}\n"
                      f"trace_sha256 = {trace_sha}\n", encoding="utf-8")
