"""User-facing errors.

A :class:`KvsimInputError` describes bad input in one line: the file, the line or row, the
field and what was expected.  The CLI prints it to stderr without a traceback and exits with
:data:`EXIT_BAD_INPUT`.  Library callers catch it like any exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: Documented exit codes (docs/cli.md).
EXIT_OK = 0
EXIT_FAILURE = 1  # an internal error or a failed check (a bug: please report it)
EXIT_BAD_INPUT = 2  # bad input file, bad option value, unknown name


class KvsimError(Exception):
    """Base class of errors kvsim reports to users without a traceback."""

    exit_code = EXIT_FAILURE


@dataclass
class KvsimInputError(KvsimError):
    """Bad input: ``path:line: field: expected X, got Y``.

    ``location`` is a human word plus number such as ``"line 12"`` or ``"row 3"``; any part
    may be None when it does not apply (a bad option value has no file).
    """

    message: str
    path: str | Path | None = None
    location: str | None = None
    field: str | None = None

    exit_code = EXIT_BAD_INPUT

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        parts: list[str] = []
        where = str(self.path) if self.path is not None else ""
        if self.location:
            where = f"{where}: {self.location}" if where else self.location
        if where:
            parts.append(where)
        if self.field:
            parts.append(f"field '{self.field}'")
        parts.append(self.message)
        # One line, always: collapse any newline a caller let through.
        return ": ".join(parts).replace("\n", " ")


_IDENTIFIER = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


def with_option_names(exc: KvsimInputError, options: dict[str, str]) -> KvsimInputError:
    """``exc`` as the command line says it: a bad option value (no file) whose field is a
    key of ``options`` (a config field or parameter name -> the option a user typed, e.g.
    ``warmup_requests`` -> ``--warmup-requests``) names the option, and so do the
    field names (with an underscore) in its message.  The API and config files keep the
    field names; ``exc`` itself is returned when nothing is renamed."""
    if exc.path is not None or exc.field not in options:
        return exc
    message = _IDENTIFIER.sub(lambda m: options.get(m.group(0), m.group(0)), exc.message)
    return KvsimInputError(message, None, exc.location, options[exc.field])


def bad_value(path, location, field, expected: str, got) -> KvsimInputError:
    """Shorthand for the common case ``expected <expected>, got <got!r>``."""
    return KvsimInputError(f"expected {expected}, got {got!r}", path, location, field)


class KvsimWarning(UserWarning):
    """Input kvsim accepts but whose meaning the user should know (one line on stderr as
    ``warning: ...``, e.g. Mooncake hash ids that do not form a prefix tree)."""


def bad_option(option: str, expected: str, got) -> KvsimInputError:
    """A bad option value: ``error: field '--opt': expected X, got Y`` (exit 2)."""
    return KvsimInputError(f"expected {expected}, got {got!r}", None, None, option)


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM (kvsim.cli.common installs the handler) so that
    ``finally`` blocks and ``atomic_output`` clean up, exactly as for Ctrl-C."""


class KvsimResourceError(KvsimError):
    """The machine refused a resource (disk full, a killed worker): one line naming the
    path or the cell, exit 1; partial outputs are removed."""

    exit_code = EXIT_FAILURE


#: What a user's code (a policy file) may never swallow or turn into its own exit:
#: interrupts pass through, everything else it raises becomes a one-line policy error.
INTERRUPTS = (KeyboardInterrupt, Terminated)
