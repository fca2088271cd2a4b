"""Calling, from Python, a function compiled without reference counting (numba's
``_nrt=False``) that takes a structref: :func:`call_uncounted`.

numba turns a structref argument into its native value (``unbox_struct_ref`` in
``numba/experimental/structref.py``) by taking a new reference to the structref's meminfo
(``nrt_meminfo_from_pyobject``), and its CPython wrapper gives that reference back after
the call only when the function counts references (``numba/core/callwrapper.py``,
``ArgumentCleanup``: ``if self.context.enable_nrt: ... decref``).  ``_nrt=False`` is a
private option of numba's (no upstream issue covers this use), so under it every call
from Python keeps one reference: the structref, and every array it holds, live until the
process ends.  Measured (issue 38): the event replay made a
:class:`kvsim.replay.kernel.core_ref.CoreRef` per batch (holding that batch's ``seen``
flags) and kept each one, ~33 bytes a request, +50 MB of peak resident set at 100x the
Mooncake trace; ``tests/sim/test_nrt_leaks.py`` counts numba's live meminfos after
replays of different batch sizes.

Functions compiled with counting, and compiled callers of these functions, are not
concerned: only a call from Python into an ``_nrt=False`` function, which kvsim makes in
a few places: the replay driver's ``core.run``, and the Python pool's operations
(:class:`kvsim.memory.pool_handle.FastPool`, which kept every pool it made alive).
"""

from __future__ import annotations

from numba.experimental.structref import StructRefProxy


def _structrefs(values):
    """The structrefs among ``values``, in tuples too (numba unboxes a tuple member by
    member)."""
    for v in values:
        if isinstance(v, StructRefProxy):
            yield v
        elif isinstance(v, tuple):
            yield from _structrefs(v)


def call_uncounted(fn, *args):
    """``fn(*args)``, ``fn`` compiled ``_nrt=False``; afterwards each structref among
    ``args`` (in tuples too) holds as many references as before the call: those numba's
    unboxing took are given back; none when a numba version gives them back itself, so
    this stays right either way."""
    held = [(r._meminfo, r._meminfo.refcount) for r in _structrefs(args)]
    try:
        return fn(*args)
    finally:
        for mi, before in held:
            for _ in range(mi.refcount - before):
                mi.release()


__all__ = ["call_uncounted"]
