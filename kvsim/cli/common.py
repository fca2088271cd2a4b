"""Conventions shared by every command: error handling, output, progress, shared options.

- Results go to stdout (a rich table, or JSON with ``--json``); progress and logs go to
  stderr, so ``kvsim ... --json | jq`` always works.
- A :class:`kvsim.core.errors.KvsimError` raised anywhere under a command becomes ONE line on
  stderr (``error: <file>: <line>: field '<f>': expected ...``) and its exit code (2 for bad
  input), never a traceback.  Exit codes are documented in docs/cli.md.
- Option errors (typer/click usage errors) are ONE line too (:meth:`KvsimGroup.main`), not
  a usage box; every option value passes :func:`check_option_value` first (floats finite,
  integers within int64, ``--seed`` >= 0), for every command, centrally.
- A Python warning (:class:`kvsim.core.errors.KvsimWarning`) is one ``warning:`` line on stderr.
- SIGTERM is turned into an exception like Ctrl-C, so ``atomic_output`` removes the
  run's temporary file before the process exits; either prints ONE line (exit 130 for
  Ctrl-C, 143 for SIGTERM), handled in :meth:`KvsimGroup.invoke` before typer's own
  handler could swallow it.  A closed stdout pipe (``kvsim inspect ... | head -1``) exits
  0 quietly; a full disk is one line naming the path, exit 1 (docs/cli.md, "Safety").
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from kvsim.core.errors import EXIT_BAD_INPUT, KvsimError, KvsimInputError, Terminated
from kvsim.core.errors import with_option_names as _with_option_names
from kvsim.core.options import (  # noqa: F401 - the option checks every command uses
    INT64_MAX,
    _base_type,
    check_environment,
    check_finite,
    check_limit,
    check_option_value,
    comma_names,
    option_error,
)

#: Exit codes of a run stopped by a signal (128 + signal number, the shell convention).
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

#: ``out_console`` (stdout: results only) and ``err_console`` (stderr: progress, warnings,
#: logs) are rich Consoles made at their first use (:func:`__getattr__`): a ``--json`` run
#: that prints nothing through them does not import rich (~0.04 CPU-s).
_CONSOLES = {"out_console": {"soft_wrap": True}, "err_console": {"stderr": True}}


def __getattr__(name: str):
    """``out_console`` / ``err_console``, made once at the first access (PEP 562)."""
    if name not in _CONSOLES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    globals()[name] = console = Console(**_CONSOLES[name])
    return console


def _broken_pool() -> tuple:
    """``BrokenProcessPool`` when a process pool was imported (only one can raise it), else
    no class: matched in ``except`` without importing multiprocessing (~0.025 CPU-s)."""
    mod = sys.modules.get("concurrent.futures.process")
    return (mod.BrokenProcessPool,) if mod is not None else ()


#: The one line of an interrupted run (docs/cli.md, "Safety").
INTERRUPTED = "interrupted (Ctrl-C); partial outputs removed"
TERMINATED = "terminated (SIGTERM); partial outputs removed"


def quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the exit's flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real descriptor (a test runner)
        pass


def rich_broken_pipe(exc: SystemExit) -> bool:
    """Whether ``exc`` is rich's exit on a closed stdout pipe: ``Console.on_broken_pipe``
    (every rich console: kvsim's tables, typer's --help) points stdout at /dev/null and
    raises ``SystemExit(1)``; kvsim exits 0 there, as for any closed pipe (docs/cli.md,
    "Exit codes").  Told apart from any other exit by the frame that raised it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return (exc.code == 1 and tb is not None and tb.tb_frame.f_code.co_name == "on_broken_pipe"
            and tb.tb_frame.f_globals.get("__name__") == "rich.console")


def fail(message: str, code: int) -> None:
    """Print one line ``error: message`` on stderr and exit with ``code``."""
    sys.stderr.write(f"error: {message}\n".replace("\r", " "))
    raise typer.Exit(code)


#: Every option that names an output, per command: param name -> kind (a key of
#: :data:`kvsim.core.fsutil.OUTPUT_SUFFIXES`, or ``"dir"``).  Every other path-valued
#: option naming an existing file or folder is an input (:func:`check_command_paths`).
#: tests/test_outputs_sacred.py fails when a command grows an output option missing here.
OUTPUT_OPTIONS: dict[str, dict[str, str]] = {
    "import-request-trace": {"out": "events"},
    "generate": {"out": "events"},
    "simulate": {"decision_log": "parquet", "requests_out": "parquet", "csv": "csv",
                 "parquet": "parquet"},
    "compare": {"decision_log_dir": "dir", "csv": "csv", "parquet": "parquet",
                "html": "html"},
    "calibrate": {"out": "toml"},
    "sweep": {"out": "dir"},
    "plan": {"out": "dir"},
    "report": {"out": "html", "png": "dir"},
}


def check_command_paths(command: str, params: dict[str, Any],
                        opts: dict[str, str] | None = None) -> None:
    """Inputs are sacred, for every command in one place (run before the command's body):
    each output option is checked (writable, named as its format) and compared with every
    input (symlinks resolved, hard links by inode) and with the other outputs
    (:func:`kvsim.core.fsutil.check_inputs_outputs`); a collision is one line naming both
    options, exit 2."""
    from pathlib import Path

    from kvsim.core.fsutil import check_inputs_outputs

    outputs_kind = OUTPUT_OPTIONS.get(command, {})
    opts = opts or {}
    outputs, inputs = [], []
    for name, value in params.items():
        option = opts.get(name, "--" + name.replace("_", "-"))
        if name in outputs_kind:
            if value is not None:
                check_outputs((option, value, outputs_kind[name]))
                outputs.append((option, value, outputs_kind[name] == "dir"))
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, (str, Path)) and str(v) and len(str(v)) < 4096:
                try:
                    exists = os.path.exists(v)
                except (OSError, ValueError):
                    exists = False
                if exists:
                    inputs.append((option, v))
    if outputs:
        check_inputs_outputs(inputs, outputs)


def _guard_paths(command: Any, name: str) -> None:
    """Run :func:`check_command_paths` before the callback of leaf command ``name``."""
    callback = getattr(command, "callback", None)
    if callback is None or getattr(command, "_kvsim_paths", False):
        return
    opts = {p.name: (max(p.opts, key=len) if p.opts else p.name)
            for p in getattr(command, "params", ())}
    # a bad value of a config field names this command's option for it (with_option_names)
    named = {f: o for f, o in ((f, opts.get(f) or FIELD_OPTIONS.get(f)) for f in
                              (*opts, *FIELD_OPTIONS)) if o in opts.values() and o[:2] == "--"}

    def guarded(*args: Any, **kwargs: Any) -> Any:
        check_environment()  # KVSIM_TMPDIR, KVSIM_TRACE_CACHE: whatever the command
        check_command_paths(name, kwargs, opts)
        from kvsim.core.fsutil import spooled_params

        try:
            with spooled_params(kwargs, set(OUTPUT_OPTIONS.get(name, ()))) as params:  # pipes
                return callback(*args, **params)
        except KvsimInputError as exc:
            raise _with_option_names(exc, named) from None

    command.callback = guarded
    command._kvsim_paths = True


#: Config fields whose option is not the command parameter of the same name; a field an
#: error names is the option of its parameter (``warmup_requests`` -> ``--warmup-requests``)
#: when the command has one.  The API and config files name the fields.
FIELD_OPTIONS = {"tier_policies": "--tier-policy", "tenant_quotas": "--tenant-quota",
                 "policy": "--policies",  # compare / sweep / warm (simulate: its --policy)
                 "shared_link_bytes_per_s": "--shared-link-gbps", "prefetch": "--no-prefetch",
                 "gpu": "--hardware"}  # estimate-kv: its own --gpu


#: Option values converted without pydantic (:class:`_PlainValue`): an integer, a decimal
#: number, as written by a person; anything else goes to typer's own conversion.
_PLAIN_INT = re.compile(r"0|-?[1-9][0-9]{0,17}")
_PLAIN_FLOAT = re.compile(r"(?:0|-?[1-9][0-9]{0,15}|-?0(?=\.))(?:\.[0-9]{1,15})?")


class _PlainValue:
    """typer's conversion of one option's value (its ``RuntimeParam``), without importing
    pydantic (0.08-0.14 CPU-s per process; docs/benchmarks.md, "Per-process fixed
    costs") where the result is plain: no value (None), a ``str`` as it is, an ``int`` or
    ``float`` written as plain digits within the option's min / max, a ``Path`` typer's own
    path checks accept (a ``bool`` flag's value typer passes through itself).  Any other
    value goes to typer's conversion, built then, so its result and every error message
    are typer's (tests/test_cli_lazy.py compares the two)."""

    def __init__(self, descriptor: Any, multi: bool) -> None:
        self.descriptor = descriptor
        self.multi = multi  # a list option given several times: only none given is plain
        self.typer_param: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:
            return () if self.multi else None
        if self.multi:
            done, out = isinstance(value, (tuple, list)) and not value, []
        else:
            done, out = self._plain(value, param, ctx)
        if done:
            return out
        if self.typer_param is None:
            from typer._coercion import build_runtime_param

            self.typer_param = build_runtime_param(self.descriptor)
        return self.typer_param.coerce(value, param=param, ctx=ctx)

    def _plain(self, value: Any, param: Any, ctx: Any) -> tuple[bool, Any]:
        kind, info = self.descriptor.annotation, self.descriptor.parameter_info
        if kind is str:
            return isinstance(value, str), value
        if kind in (int, float):
            if isinstance(value, str):
                plain = (_PLAIN_INT if kind is int else _PLAIN_FLOAT).fullmatch(value)
                value = kind(value) if plain else None
            if type(value) is not kind or (info.min is not None and value < info.min) or \
                    (info.max is not None and value > info.max):
                return False, None
            return True, value
        if kind is Path and isinstance(value, str) and value and "\0" not in value:
            from typer._param_types import coerce_cli_path

            try:
                return True, coerce_cli_path(Path(value), info, path_type=Path, param=param,
                                             ctx=ctx)
            except Exception:  # typer's conversion raises its own error
                return False, None
        return False, None


def _plain_value(param: Any) -> None:
    """Give ``param`` a :class:`_PlainValue` when its type is one it converts (one value of
    ``str``, ``int``, ``float``, ``Path``, ``bool``, or a list option; no parser, choices
    or clamp)."""
    d = getattr(param, "type_descriptor", None)
    if d is None or getattr(param, "_runtime_param", 0) is not None or param.nargs != 1:
        return
    info = d.parameter_info
    if param.multiple:
        if d.is_list:
            param._runtime_param = _PlainValue(d, True)
        return
    if d.annotation not in (str, int, float, Path, bool) or info.parser is not None or \
            d.file_annotation is not None or d.is_choice or info.clamp or \
            (d.annotation is Path and info.path_type not in (None, Path)):
        return
    param._runtime_param = _PlainValue(d, False)


def _guard_params(command: Any, name: str = "") -> None:
    """Wrap every option's value processing of ``command`` (and its subcommands) with
    :func:`check_option_value`, and every leaf command's body with
    :func:`check_command_paths`; plain values are converted without pydantic
    (:class:`_PlainValue`)."""
    if not getattr(command, "commands", None) and name:
        _guard_paths(command, name)
    if hasattr(command, "get_help_option") and not getattr(command, "_kvsim_help", False):
        help_option = command.get_help_option  # made on first use, for a context

        def get_help_option(ctx: Any, _made=help_option) -> Any:
            option = _made(ctx)
            if option is not None:
                _plain_value(option)
            return option

        command.get_help_option = get_help_option
        command._kvsim_help = True
    for param in getattr(command, "params", ()):
        _plain_value(param)
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_kvsim_checked", False):
            continue
        base = _base_type(descriptor.annotation)
        if base not in (int, float):
            continue
        option = max(param.opts, key=len) if param.opts else param.name
        original = param.process_value

        def process_value(ctx: Any, value: Any, _orig=original, _opt=option,
                          _base=base) -> Any:
            check_option_value(_opt, _base, value)
            return _orig(ctx, value)

        param.process_value = process_value
        param._kvsim_checked = True
    for sub_name, sub in getattr(command, "commands", {}).items():
        _guard_params(sub, sub_name)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).replace("\n", " ")
    sys.stderr.write(f"warning: {text}\n")


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def install_signal_handlers() -> None:
    """SIGTERM raises :class:`kvsim.core.errors.Terminated` (cleaned up like Ctrl-C); main thread only."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def _interrupt_cause(exc: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM behind ``exc`` (its ``__cause__`` / ``__context__`` chain), if
    any: how a signal arriving inside numba-compiled code reaches Python."""
    seen = set()
    e = exc.__cause__ or exc.__context__
    while e is not None and id(e) not in seen:
        if isinstance(e, (KeyboardInterrupt, Terminated)):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


class KvsimGroup(TyperGroup):
    """The root command group: turns user errors into one line and an exit code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _guard_params(self)

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """Run the command; in standalone mode every way out is one line and an exit code:
        option errors (typer/click ``UsageError``) -> ``error: ...``, exit 2; Ctrl-C ->
        exit 130, SIGTERM -> exit 143 (after ``atomic_output`` removed its temp file)."""
        from typer._click import exceptions as cx

        if not standalone_mode:
            return super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=False, **extra)
        from kvsim.core.errors import KvsimWarning
        from kvsim.core.process_gc import use_cli_thresholds

        install_signal_handlers()
        use_cli_thresholds()  # the start-up's objects not scanned again and again
        guard = warnings.catch_warnings()
        guard.__enter__()
        warnings.simplefilter("always", KvsimWarning)  # every run shows its warnings
        warnings.showwarning = _show_warning
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except cx.NoArgsIsHelpError as exc:  # `kvsim log`: show the help, as before
            sys.stdout.write(exc.ctx.get_help() + "\n")
            sys.exit(EXIT_BAD_INPUT)
        except cx.ClickException as exc:
            message = " ".join(exc.format_message().split())
            sys.stderr.write(f"error: {message}\n")
            sys.exit(EXIT_BAD_INPUT if isinstance(exc, cx.UsageError) else exc.exit_code)
        except KvsimError as exc:  # raised while parsing the root's own options
            sys.stderr.write(f"error: {exc}\n".replace("\r", " "))
            sys.exit(exc.exit_code)
        except typer.Abort:
            sys.stderr.write(f"error: {INTERRUPTED}\n")
            sys.exit(EXIT_SIGINT)
        except SystemExit as exc:  # rich's on a closed pipe: `kvsim inspect t | head -1`
            if not rich_broken_pipe(exc):
                raise
            quiet_stdout()
            sys.exit(0)
        except KeyboardInterrupt:
            sys.stderr.write(f"error: {INTERRUPTED}\n")
            sys.exit(EXIT_SIGINT)
        except Terminated:
            sys.stderr.write(f"error: {TERMINATED}\n")
            sys.exit(EXIT_SIGTERM)
        finally:
            guard.__exit__(None, None, None)
        sys.exit(rv if isinstance(rv, int) else 0)

    def make_context(self, info_name: Any, args: Any, parent: Any = None,
                     **extra: Any) -> Any:
        """Parse the root's options (and run their callbacks) as typer does, with Ctrl-C /
        SIGTERM there, or while the context closes after the command, as one line: typer
        turns a ``KeyboardInterrupt`` outside ``invoke`` into a silent exit 130."""
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except BrokenPipeError:  # `kvsim --version | true` (typer: a silent exit 1)
            quiet_stdout()
            raise typer.Exit(0) from None
        except KeyboardInterrupt:
            fail(INTERRUPTED, EXIT_SIGINT)
        except Terminated:
            fail(TERMINATED, EXIT_SIGTERM)
        # the context's close (call_on_close callbacks, resources): what its __exit__ runs
        name = "_close_with_exception_info" if hasattr(ctx, "_close_with_exception_info") \
            else "close"
        close = getattr(ctx, name)

        def close_interruptible(*args: Any) -> Any:
            try:
                return close(*args)
            except KeyboardInterrupt:
                fail(INTERRUPTED, EXIT_SIGINT)

        setattr(ctx, name, close_interruptible)
        return ctx

    def invoke(self, ctx: Any) -> Any:
        # Interrupts, a closed pipe and a full disk are handled here, inside typer's own
        # handler (which would turn Ctrl-C into a silent exit 130 and a closed pipe into
        # exit 1); ``atomic_output`` has removed partial outputs by the time they arrive.
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            fail(INTERRUPTED, EXIT_SIGINT)
        except Terminated:
            fail(TERMINATED, EXIT_SIGTERM)
        except SystemError as exc:
            # a signal whose handler raised inside compiled code (numba reports the
            # KeyboardInterrupt / Terminated it could not propagate as the cause of a
            # SystemError, e.g. "CPUDispatcher(...) returned a result with an exception set")
            cause = _interrupt_cause(exc)
            if cause is None:
                raise
            fail(INTERRUPTED if isinstance(cause, KeyboardInterrupt) else TERMINATED,
                 EXIT_SIGINT if isinstance(cause, KeyboardInterrupt) else EXIT_SIGTERM)
        except EOFError as exc:  # typer would report it as Ctrl-C ("Aborted")
            fail(f"unexpected end of a file ({exc or 'EOFError'}); no Ctrl-C was pressed", 1)
        except BrokenPipeError:
            quiet_stdout()  # `kvsim ... | head -1`: the reader has what it wanted
            raise typer.Exit(0) from None
        except KvsimError as exc:
            fail(str(exc).replace("\n", " "), exc.exit_code)
        except _broken_pool():  # a worker killed (the OOM killer, a signal)
            fail("a worker process died (killed: out of memory or a signal); run the "
                 "command again (with fewer --jobs if memory is short)", 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            fail(f"{exc.filename}: {exc.strerror}", EXIT_BAD_INPUT)
        except OSError as exc:
            from kvsim.core.fsutil import PATH_ERRNOS, disk_full_cause, is_disk_full

            if exc.errno in PATH_ERRNOS and exc.filename:  # `--trace` of a name too long
                fail(f"{exc.filename}: {exc.strerror}", EXIT_BAD_INPUT)
            if not is_disk_full(exc):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            fail(f"{where}{disk_full_cause(exc)}; partial outputs removed", 1)


def check_outputs(*specs: tuple[str, Any, str]) -> None:
    """Check every output of a command before any work (reusable by every command):
    ``(option, path or None, kind)`` with kind a key of
    :data:`kvsim.core.fsutil.OUTPUT_SUFFIXES` (the name must end as the format written) or
    ``"dir"``.  Raises a one-line :class:`KvsimInputError` naming the option and target."""
    from kvsim.core.fsutil import check_output_dir, check_output_path, check_output_suffix

    for option, path, kind in specs:
        if path is None:
            continue
        if kind == "dir":
            check_output_dir(path, option)
        else:
            check_output_suffix(check_output_path(path, option), kind, option)


JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the result as JSON on stdout (stable keys, "
                       "documented in docs/cli.md) instead of a table.")
]


def _jsonable(obj: Any) -> Any:
    import numpy as np  # here: `kvsim --help` / `--version` import no numpy

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return _jsonable(asdict(obj))
    return obj


def emit_json(obj: Any) -> None:
    """Write ``obj`` as JSON to stdout (numpy scalars converted, NaN/inf as null)."""
    sys.stdout.write(json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n")


def quiet_progress(json_: bool) -> bool:
    """Progress is silent under ``--json`` when stdout is not a terminal (a pipe or a file:
    a script reads the JSON, nobody watches the bar)."""
    return bool(json_) and not sys.stdout.isatty()


def progress(transient: bool = True, quiet: bool = False):
    """A rich progress bar on stderr: description, bar, done/total, elapsed, ETA (hidden
    when ``quiet``, see :func:`quiet_progress`).  When stderr is not a terminal: one plain
    line every 10 s instead (:class:`kvsim.cli.meter.LineProgress`)."""
    from kvsim.cli.meter import COMPILES

    COMPILES.install()  # before any worker is forked: it reports its compiles too
    if quiet:  # rich's bar disabled showed nothing either; rich is not imported
        from kvsim.cli.meter import SilentProgress

        return SilentProgress()
    err = globals().get("err_console") or __getattr__("err_console")
    if not err.is_terminal:
        from kvsim.cli.meter import LineProgress

        return LineProgress()
    from kvsim.cli.meter import rich_progress

    return rich_progress(err, transient)
