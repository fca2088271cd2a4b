"""Issue #33: s3fifo under a preemption storm.  When every block of MAIN is held by the
running requests and MAIN is over its size, the victim is SMALL's unheld block; before
the fix MAIN's sweep walked over the held blocks forever (sweeps hung 17 and 29 minutes
in one s3fifo cell).  Run in a fresh process with a timeout: on the old code the
compiled sweep never returns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
sys.path.insert(0, %r)
from tests.policies.harness import Driver
from kvsim.policy.registry import get_policy

d = Driver(get_policy("s3fifo"), capacity=10, num_slots=16, params={"small_size_ratio": 0.5})
for b in range(10):          # SMALL: 0-4, MAIN: 5-9 (before the first eviction), all held
    d.allocate(b)
for b in (0, 1):             # two reuses each while running: freq 2
    for _ in range(2):
        d.release(b)
        d.hold(b)
d.release(4)
d.allocate(10)               # 0 and 1 move to MAIN (7 > its size 5); 4 is the victim
d.release(3)
d.allocate(11)               # MAIN all held and over its size: the victim is 3, in SMALL
print(json.dumps(d.victims))
"""


def test_victim_from_small_when_main_is_all_held():
    res = subprocess.run([sys.executable, "-c", SCRIPT % str(ROOT)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [4, 3]
