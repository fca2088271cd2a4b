"""numba compile-time patches that change how fast numba compiles, never what it compiles.

numba's overload resolution keys its per-template cache of implementations
(``numba.core.typing.templates._OverloadMethodTemplate._get_impl``, every ``@overload``
and ``@overload_method``, i.e. most of numpy's and Python's builtins) on the compile's
flags, a ``numba.core.targetconfig.TargetConfig``.  Hashing and comparing that key builds
``TargetConfig.values()``, a dict of all of the flags' ~30 options, each read through a
Python property: in the README job's cold compile that was ~11 million property reads
(`bench/prof_compile_phases.py`, cProfile: ``targetconfig.getter`` at the top of the
profile by own time).  :func:`install` replaces ``values()`` with the same dict built
from a per-class table of the defaults and the options set: the same keys, in the same
order, the same values, at C speed.  Measured on the README job compiled in one process
(``KVSIM_COMPILE_WORKERS=1``, empty caches, two pairs alternated): 37.2 / 35.6 -> 34.4 /
34.0 CPU-s, the same JSON (docs/benchmarks.md, "Cold compile").

Installed once per process by :func:`kvsim.numba_cache.seal` (every compiled path of kvsim
goes through it).  ``KVSIM_NUMBA_PATCHES=0`` leaves numba as it is (for comparison).
"""

from __future__ import annotations

import os

_INSTALLED = False
#: numba's own ``TargetConfig.values``, kept for the tests' comparison
ORIGINAL_VALUES = None


def _values(self) -> dict:
    """``TargetConfig.values()``: every option's value, the default where it is not set
    (numba: ``{k: getattr(self, k) for k in self.options}``)."""
    cls = type(self)
    defaults = cls.__dict__.get("_kvsim_defaults")
    if defaults is None:
        defaults = {name: option.default for name, option in cls.options.items()}
        cls._kvsim_defaults = defaults
    out = dict(defaults)
    out.update(self._values)
    return out


def install() -> None:
    """Patch numba (once per process; no-op with ``KVSIM_NUMBA_PATCHES=0`` or on a numba
    whose ``TargetConfig`` does not have the layout the patch assumes)."""
    global _INSTALLED, ORIGINAL_VALUES
    if _INSTALLED or os.environ.get("KVSIM_NUMBA_PATCHES", "1") == "0":
        return
    from numba.core import targetconfig

    cls = targetconfig.TargetConfig
    if "_values" not in getattr(cls, "__slots__", ()) or not hasattr(cls, "options"):
        return  # another numba layout: leave it alone
    ORIGINAL_VALUES = cls.values
    cls.values = _values
    _INSTALLED = True


__all__ = ["install"]
