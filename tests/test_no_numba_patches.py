"""kvsim never writes into numba (issue #31): no module of ``kvsim/`` or ``policies/``
assigns, deletes or mutates an attribute of numba or of an object numba made.

A numba release inside the pinned range may rename or reshape any private attribute; a
patch of one would break silently.  kvsim uses numba only through what it offers: the
decorators and their options, ``Dispatcher.compile``, first-class function values,
structrefs, ``NUMBA_*`` settings (environment) and numba's cache directory.

Flagged, by static analysis (:mod:`ast`) of every module:

* an assignment, augmented assignment or ``del`` whose target is an attribute (or an item
  of an attribute) rooted in a name bound from ``numba`` (``import numba``, ``from numba...
  import X``) or in a local name taken from one (``cls = targetconfig.TargetConfig``);
* the same whose attribute is one that numba's objects have (:func:`numba_attributes`:
  the attributes of numba's dispatcher, caches, code libraries, target contexts, typing
  templates and IR classes, and the instance attributes of a live cached dispatcher, its
  cache, cache file and locator), on any object other than ``self``
  (``dispatcher.add_overload = ...``, ``x._cache_file._source_stamp = ...``,
  ``dispatcher.targetoptions[...] = ...``), or, in a module that imports numba, whose name
  marks kvsim state stashed on a foreign object (``_kvsim*``);
* ``setattr`` / ``delattr`` on such an object or with such a constant name;
* a mutating method call (``append``, ``insert``, ``update``, ...) on an attribute rooted
  in a numba name (``caching._CacheImpl._locator_classes.insert(0, X)``).
"""

from __future__ import annotations

import ast
import textwrap
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MUTATORS = {"append", "insert", "extend", "update", "setdefault", "pop", "popitem", "remove",
            "clear", "add", "discard", "__setitem__", "__delitem__", "__setattr__"}


@lru_cache(maxsize=1)
def numba_attributes() -> frozenset[str]:
    """Attribute names numba's own objects carry (class and instance attributes), less
    those every Python object or function has."""
    import importlib.util
    import tempfile

    from numba.core import caching, codegen, cpu, ir, targetconfig
    from numba.core.base import BaseContext
    from numba.core.compiler import Flags
    from numba.core.dispatcher import Dispatcher
    from numba.core.runtime.context import NRTContext
    from numba.core.types.functions import BaseFunction
    from numba.core.typing import templates

    names: set[str] = set()
    # (class names differ across numba releases: take those this one has)
    named = [getattr(caching, n, None) for n in ("FunctionCache", "Cache", "CacheImpl",
                                                 "_CacheImpl", "IndexDataCacheFile",
                                                 "_CacheLocator")]
    named += [getattr(codegen, n, None) for n in ("CPUCodeLibrary", "JITCPUCodegen")]
    for cls in (Dispatcher, cpu.CPUContext, BaseContext, targetconfig.TargetConfig, Flags,
                BaseFunction, NRTContext, ir.Inst, ir.Var, templates.AbstractTemplate, *named):
        if cls is not None:
            names.update(dir(cls))
    # instance attributes of a live cached dispatcher and of its cache's parts
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kvsim_probe_mod.py"
        path.write_text("from numba import njit\n@njit(cache=True)\ndef f(x):\n    return x\n")
        spec = importlib.util.spec_from_file_location("kvsim_probe_mod", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        d = mod.f
        cache = d._cache
        for obj in (d, cache, getattr(cache, "_impl", None), getattr(cache, "_cache_file", None),
                    getattr(getattr(cache, "_impl", None), "locator", None)):
            if obj is not None:
                names.update(vars(obj))
    common = set(dir(object)) | set(dir(lambda: 0)) | set(dir(ast)) | {"__wrapped__"}
    return frozenset(names - common)


def _root(node: ast.AST) -> str | None:
    """The name an attribute / item chain starts from (``a`` of ``a.b[c].d``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _numba_names(tree: ast.AST) -> set[str]:
    """Names bound from numba anywhere in the module, and local names assigned from an
    expression rooted in one (repeated to a fixed point)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "numba" or a.name.startswith("numba."):
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "numba" or node.module.startswith("numba.")) and not node.level:
            names.update(a.asname or a.name for a in node.names)
    assigns = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)]
    while True:
        before = len(names)
        for n in assigns:
            if _root(n.value) in names and not isinstance(n.value, ast.Call):
                for t in n.targets:
                    for leaf in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                        if isinstance(leaf, ast.Name):
                            names.add(leaf.id)
        if len(names) == before:
            return names


def violations(source: str, filename: str = "<src>") -> list[str]:
    """Every write into numba ``source`` makes, as ``file:line: text``."""
    tree = ast.parse(source, filename)
    numba_names = _numba_names(tree)
    attrs = numba_attributes()
    out: list[str] = []

    def flag(node: ast.AST, why: str) -> None:
        out.append(f"{filename}:{node.lineno}: {why}: {ast.unparse(node).splitlines()[0]}")

    def check_target(t: ast.AST, stmt: ast.AST) -> None:
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                check_target(e, stmt)
            return
        if isinstance(t, ast.Starred):
            check_target(t.value, stmt)
            return
        if not isinstance(t, (ast.Attribute, ast.Subscript)):
            return
        root = _root(t)
        if root in numba_names:
            flag(stmt, f"writes into numba ({root})")
            return
        if root == "self":
            return
        node = t.value if isinstance(t, ast.Subscript) else t
        while isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute):
            if node.attr in attrs:
                flag(stmt, f"writes numba attribute {node.attr!r}")
            elif node.attr.startswith("_kvsim") and numba_names:
                flag(stmt, f"stashes kvsim state {node.attr!r} on another object")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "vars" and node.args and _root(node.args[0]) in numba_names:
            flag(stmt, "writes into numba through vars()")

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                check_target(t, node)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.target is not None:
            check_target(node.target, node)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                check_target(t, node)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and node.args:
                name = node.args[1] if len(node.args) > 1 else None
                if _root(node.args[0]) in numba_names:
                    flag(node, f"{f.id} on numba")
                elif isinstance(name, ast.Constant) and isinstance(name.value, str) and (
                        name.value in attrs or name.value.startswith("_kvsim")):
                    flag(node, f"{f.id} of numba attribute {name.value!r}")
            elif isinstance(f, ast.Attribute) and f.attr in MUTATORS and \
                    isinstance(f.value, ast.Attribute) and _root(f.value) in numba_names:
                flag(node, f"mutates numba state ({f.attr})")
    return out


#: The one documented registration into numba kvsim makes: ``ir_utils.alias_func_extensions``
#: is numba's table for extensions to declare that a call returns an alias of its argument
#: (numba registers its own there; kvsim/policy/state_access.py explains why ``STATE.of``
#: needs it: without it dead-code elimination drops stores through the named view).  Only
#: these lines of that file may write it.
ALLOWED = {("kvsim/policy/state_access.py", "ir_utils.alias_func_extensions[")}


def _allowed(line: str) -> bool:
    path, _, rest = line.partition(":")
    text = rest.partition(": ")[2].partition(": ")[2]
    return any(path.endswith(p) and text.startswith(t) for p, t in ALLOWED)


def _modules() -> list[Path]:
    files = sorted((ROOT / "kvsim").rglob("*.py")) + sorted((ROOT / "policies").rglob("*.py"))
    return [p for p in files if "__pycache__" not in p.parts]


def test_no_module_writes_into_numba() -> None:
    found = []
    for path in _modules():
        found += [v for v in violations(path.read_text(), str(path.relative_to(ROOT)))
                  if not _allowed(v)]
    assert not found, "writes into numba:\n" + "\n".join(found)


@pytest.mark.parametrize("src", [
    "import numba\nnumba.njit = lambda f: f\n",
    "from numba.core import targetconfig\ncls = targetconfig.TargetConfig\ncls.values = 1\n",
    "from numba.core.types.functions import BaseFunction\nBaseFunction.get_call_type = 1\n",
    "from numba.core import ir\nir.Inst._rec_list_vars = 1\n",
    "def f(dispatcher):\n    dispatcher.add_overload = 1\n",
    "def f(dispatcher):\n    dispatcher._compile_for_args = 1\n",
    "def f(x):\n    x._cache_file._source_stamp = ('kvsim', 1)\n",
    "def f(d):\n    d._cache = None\n",
    "def f(d):\n    d.targetoptions['no_cpython_wrapper'] = True\n",
    "import numba\ndef f(d):\n    d._kvsim_entry = 1\n",
    "def f(d):\n    setattr(d, 'get_call_template', 1)\n",
    "import numba\nsetattr(numba, 'njit', 1)\n",
    "from numba.core import caching\ncaching._CacheImpl._locator_classes.insert(0, 1)\n",
    "from numba.core import cpu\ndel cpu.CPUContext.get_executable\n",
])
def test_catches_each_kind_of_patch(src: str) -> None:
    assert violations(textwrap.dedent(src)), src


@pytest.mark.parametrize("src", [
    "import numba\nx = numba.njit(cache=True)(lambda a: a)\n",
    "from numba.experimental import structref\nclass T:\n    def __init__(self):\n"
    "        self.x = 1\n",
    "import types\nm = types.ModuleType('m')\nm.mem = 1\n",
    "import os\nos.environ['NUMBA_CACHE_DIR'] = '/tmp/x'\n",
])
def test_allows_ordinary_code(src: str) -> None:
    assert not violations(src), violations(src)
