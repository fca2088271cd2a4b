"""kvsim's Python API: what every command calls.

- :class:`SimConfig` (:mod:`kvsim.spec.sim_config`): the frozen replay configuration, help
  per field.
- :func:`simulate` ``(trace_path, policy, config=None, decision_log=None) -> SimResult``:
  one policy (:mod:`kvsim.replay.driver`).
- :func:`compare` ``(trace_path, policies=None, config=None, decision_log_dir=None,
  jobs=1) -> pandas.DataFrame``: many policies, one row each, columns = the ``--json``
  keys (:mod:`kvsim.modes.comparison`).
- :class:`SimResult`: ``summary`` dict, ``requests`` and ``steps`` DataFrames.
- :func:`scan_trace`: the pre-pass of an event file (reusable across replays).
"""

from __future__ import annotations

from kvsim.engine.lowering import import_request_trace
from kvsim.modes.comparison import compare
from kvsim.modes.dispatch import simulate
from kvsim.replay.driver import SimResult, scan_trace
from kvsim.spec.sim_config import SimConfig

__all__ = ["SimConfig", "SimResult", "compare", "import_request_trace", "scan_trace", "simulate"]
