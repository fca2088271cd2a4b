"""kvsim's numba struct types (structrefs) with short names: :class:`StructType`.

numba names a structref type after all its fields, ``numba.CoreRefType(('K', Array(int64,
1d, C)), ('X', ...), ...)``, recursively (a field that is itself a structref, or a tuple
of first-class functions whose signatures take one, is spelled out in full), and it
spells that name into every symbol of compiled code that takes the type: each function's
mangled name (numba's Itanium mangling of its argument types), its environment global,
its destructor and the constant strings of its error paths.  The replay core's state
(``CoreRef``: 34 members, among them the HBM pool, three tiers and their policies' hook
tuples) made names of ~85-105 KB: in numba's disk cache, ``core.run``'s library held
~3 MB of symbol names (of its 3.9 MB of LLVM bitcode and 3.5 MB of object code), and
every process pays for them when it loads the library (parsing the bitcode, loading the
object, reading the symbols back: docs/benchmarks.md, "Per-process floor: short struct type
names").

:class:`StructType` keeps numba's structref and its field list (``field_dict``, the data
model, equality) and only names the type ``numba.<Class>#<digest>``: the class name and
20 hex digits of the SHA-256 of numba's full name.  Two types are equal iff their full
names are (the digest is a function of it; a collision of 80-bit digests among kvsim's
handful of struct types is not a practical concern), so typing, overload selection and
numba's cache index (keyed on the argument types) see the same distinctions as before.
Numba documents ``Type.name`` as the type's name and ``mangling_args`` as derived from it;
kvsim sets ``name`` on its own instance in its own ``__init__`` (numba is not touched).

Also: fields are stored ``unliteral`` (a literal constant assigned to a field is typed by
its plain type), as every kvsim struct type did on its own before.
"""

from __future__ import annotations

import hashlib

from numba.core import types


def short_name(class_name: str, full_name: str) -> str:
    """``numba.<class_name>#<20 hex digits of sha256(full_name)>``."""
    digest = hashlib.sha256(full_name.encode()).hexdigest()[:20]
    return f"numba.{class_name}#{digest}"


class StructType(types.StructRef):
    """A numba structref type named by :func:`short_name` (see the module docstring).
    Subclass it as ``types.StructRef`` and register it with ``structref.register``."""

    def __init__(self, fields):
        super().__init__(fields)
        #: numba's own name of this type (the full field list), for messages and debugging
        self.full_name = self.name
        self.name = short_name(type(self).__qualname__, self.full_name)

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(t)) for name, t in fields)


__all__ = ["StructType", "short_name"]
