"""kvsim: an offline, trace-driven simulator and policy lab for LLM KV-cache memory.

The data flow is: request trace -> canonical Request table -> MemoryIntent block events
(:mod:`kvsim.schema`) -> replay through tiered, paged, prefix-shared KV memory under a
placement policy -> metrics and a decision log.  Every CLI command is a thin shell over a
function in this package; see ``docs/architecture.md``.
"""

__version__ = "0.1.0"


def _serve_checkout_subpackages() -> None:
    """Let ``kvsim.policies`` and ``kvsim.profiles`` resolve in a source checkout.

    An installed kvsim has them as real subpackages (pyproject maps ``policies/`` and
    ``profiles/`` there).  Python started in the repository root (``python -m kvsim``) imports
    the checkout's ``kvsim/`` instead, whose folder does not hold them: add the checkout root to
    this package's search path so the same names resolve to the folders beside ``kvsim/``.
    """
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "policies" / "__init__.py").is_file():
        if str(root) not in __path__:
            __path__.append(str(root))


_serve_checkout_subpackages()
