"""Regenerate the example tables in docs/simulate.md and docs/policies.md from one real run
of the README's main job, so they cannot go stale (issue #33: they showed old numbers).

    python bench/doc_tables.py           # rewrite the tables between the markers
    python bench/doc_tables.py --check   # exit 1 (and say which) when a doc differs

The job: ``kvsim compare --profile deadline_pressure --requests 256 --seed 0 --hbm-gb 8``
(deterministic: same code, same tables).  Each table sits between
``<!-- doc-table: NAME -->`` and ``<!-- /doc-table: NAME -->`` in its doc;
tests/test_doc_tables.py runs ``--check``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ["compare", "--profile", "deadline_pressure", "--requests", "256", "--seed", "0",
       "--hbm-gb", "8"]
DOCS = {"compare_console": ROOT / "docs" / "simulate.md",
        "policies_main_job": ROOT / "docs" / "policies.md"}


def run_job() -> tuple[str, object]:
    """The job's table as printed at 120 columns, and its rows (a DataFrame)."""
    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(tmp) / "rows.parquet"
        env = {**os.environ, "COLUMNS": "120"}
        res = subprocess.run([sys.executable, "-m", "kvsim", *JOB, "--parquet", str(rows)],
                             capture_output=True, text=True, env=env, check=True, cwd=tmp)
        return res.stdout, pd.read_parquet(rows)


def tables(stdout: str, df) -> dict[str, str]:
    console = "```\n$ COLUMNS=120 kvsim " + " ".join(JOB) + "\n" + stdout.rstrip("\n") + "\n```"
    lines = ["| policy | HBM hit | evictions | decode-critical misses |", "|---|---:|---:|---:|"]
    df = df.assign(_order=(-df["hbm_hit_rate"]).rank(method="first"))
    for _, r in df.sort_values(["_order"]).iterrows():
        label = r["policy"] + (f" (offline {r['bound_claim']})" if bool(r["offline"])
                               and isinstance(r.get("bound_claim"), str) else
                               " (offline)" if bool(r["offline"]) else "")
        lines.append(f"| {label} | {100 * r['hbm_hit_rate']:.2f} % | "
                     f"{int(r['evictions']):,} | {int(r['decode_critical_misses']):,} |")
    return {"compare_console": console, "policies_main_job": "\n".join(lines)}


def _span(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- doc-table: {name} -->\n)(.*?)(\n<!-- /doc-table: {name} -->)",
                      re.S)


def apply(new: dict[str, str], check: bool) -> list[str]:
    """Rewrite (or, with ``check``, compare) each table; the names that differ."""
    stale = []
    for name, text in new.items():
        doc = DOCS[name]
        body = doc.read_text(encoding="utf-8")
        m = _span(name).search(body)
        if m is None:
            raise SystemExit(f"{doc}: no <!-- doc-table: {name} --> markers")
        if m.group(2) != text:
            stale.append(name)
            if not check:
                doc.write_text(body[:m.start(2)] + text + body[m.end(2):], encoding="utf-8")
    return stale


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = apply(tables(*run_job()), check)
    for name in stale:
        print(f"{DOCS[name].relative_to(ROOT)}: table {name} "
              + ("differs from the run (python bench/doc_tables.py)" if check else "rewritten"))
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
