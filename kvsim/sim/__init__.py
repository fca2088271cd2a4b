"""Replay: the tiered replay loop, cost model, metrics, and the single-tier cache simulator.

API (re-exported lazily, so importing a submodule stays cheap):

- :class:`SimConfig` (kvsim.sim.config): frozen replay configuration, help per field.
- :func:`simulate` ``(trace_path, policy, config=None, decision_log=None) -> SimResult``
- :func:`compare` ``(trace_path, policies=None, config=None, decision_log_dir=None,
  jobs=1) -> pandas.DataFrame`` (policies as rows, columns = the ``--json`` keys).
- :class:`SimResult` (kvsim.sim.replay): ``summary`` dict, ``requests`` and ``steps``
  DataFrames.
- ``kvsim.sim.cachesim``: the single-tier cache simulator (policies engineer).
"""

_EXPORTS = {"SimConfig": "kvsim.sim.config", "simulate": "kvsim.sim.replay",
            "compare": "kvsim.sim.comparison", "SimResult": "kvsim.sim.replay",
            "scan_trace": "kvsim.sim.replay"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kvsim.sim' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
