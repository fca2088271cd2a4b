"""The ``kvsim`` command line: a typer app whose commands are thin shells over the API.

Each command lives in its own module below; importing the module registers its commands on
:data:`app`.  Shared conventions (errors, JSON, progress) are in :mod:`kvsim.cli.common`.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from collections.abc import MutableMapping
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperCommand

from kvsim import __version__
from kvsim.cli.common import KvsimGroup

# One module per command (group); each registers itself on `app` when imported, and is
# imported only when its command runs (or its own --help is asked): `kvsim --help` and
# `kvsim --version` import no command module, numba or pandas (docs/benchmarks.md, "Import").
#: Every command (group), in the order the root's --help lists it: name -> (module under
#: kvsim.cli that registers it, hidden, the first paragraph of its help, which the root's
#: --help shows).  tests/test_cli_lazy.py checks it against the modules themselves.
COMMANDS: dict[str, tuple[str, bool, str]] = {
    "inspect": ("inspect", False, "Validate an event file and summarize it: requests, blocks, "
                "bytes, steps, tokens, prefix reuse."),
    "estimate-kv": ("estimate", False, "Size the KV cache of a model: bytes per token and "
                    "block, paged vs naive per request,\ntotals for a concurrency, and how many "
                    "sequences fit on a GPU beside the weights."),
    "demo": ("compat", True, "kv_deadline_scheduler's `kvmi demo`: kvsim's equivalent is "
             "`kvsim compare\n--profile NAME` (this command only says so)."),
    "import-request-trace": (
        "importing", False, "Read a request trace (Mooncake, Azure, OpenAI proxy log, agentic "
        "conversations,\nkvmi events, RAGPulse, Bailian, BurstGPT, a vLLM KV-event recording, "
        "or any\nJSONL/CSV/Parquet with --map) and lower it through the engine model\n"
        "(continuous batching, chunked prefill, step times of --timing) to MemoryIntent block"
        "\nevents.  Prints a summary (requests, events, prefix reuse, skipped rows)."),
    "generate": ("generate", False, "Generate a synthetic workload from a TOML profile "
                 "(sessions, SLOs, priorities, shared\nprefixes, RAG documents, speculative "
                 "decoding, beams) and lower it through the engine\nmodel to MemoryIntent block "
                 "events.  Deterministic for a given --seed."),
    "simulate": ("simulate", False, "Replay an event file under one placement policy through "
                 "HBM/DRAM/CXL/NVMe and report latency, hit rates and traffic."),
    "compare": ("simulate", False, "Replay the same trace under every policy (or a list) and "
                "print one table: who wins, by how much, and the gap to Belady's bound."),
    "calibrate": (
        "calibrate", False, "Time gather, scatter, spill, promote, disk write and disk read on "
        "a real KV pool for\ntransfers of 64 KiB..64 MiB, fit latency + bytes/bandwidth to "
        "each, and write a hardware\nprofile whose dram and nvme tiers carry the measured "
        "numbers (with provenance).  Use\nit with [bold]kvsim simulate/compare --hardware "
        "FILE[/bold].  With --from-vllm-bench:\nfit engine step times to a vLLM benchmark "
        "result instead (a timing profile for\n[bold]--timing FILE[/bold])."),
    "replay": (
        "calibrate", False, "Replay the spills (DEMOTE, WRITE_THROUGH) and fetches (PROMOTE, "
        "PREFETCH) of a\ndecision log on a real KV pool, batch by batch, and compare the "
        "measured time with the\nsimulator's cost_us per action type and tier path: the cost "
        "model's error on this\nmachine.  relative_error = (predicted - measured) / measured."),
    "sweep": ("sweep", False, "Replay a trace over a grid of policies x HBM (x DRAM) sizes, in "
              "parallel or on Ray; cached and resumable."),
    "report": ("sweep", False, "Draw a sweep: one self-contained HTML file (and PNGs): hit rate "
               "vs capacity, latency CDFs, p99, link bytes, occupancy."),
    "plan": ("plan", False, "Search replicas x GPU kind x tier sizes x policies for the "
             "cheapest configuration meeting an SLO; Pareto front and $ per M tokens."),
    "validate": ("validate", False, "Check kvsim against vLLM: its block pool against a "
                 "KV-event recording, or its scheduler step by step against a scheduler "
                 "recording."),
    "reorder": ("reorder", False, "Serve a request trace as one batch job in submission, "
                "prefix-grouped and prefix-tree (DFS) order: hit rate, makespan, throughput."),
    "warm": ("warm", False, "Compile the replay core into numba's disk cache now (once after "
             "pip install), so the\nfirst simulate / compare loads it instead of "
             "compiling."),
    "log": ("log", False, "Read decision logs: why each eviction, what it cost, where two "
            "policies diverge (summary / show / explain / diff / timeline)."),
}


class _Commands(MutableMapping):
    """The root group's commands, built on first access: the keys are every command of
    :data:`COMMANDS` (and any other registered on `app`); reading one imports its module and
    builds it (typer, as for every other command)."""

    def __init__(self, built: dict) -> None:
        self.built = dict(built)

    def _unlisted(self) -> list[str]:
        """The commands registered on `app` that :data:`COMMANDS` does not name."""
        return [name for name in self.built if name not in COMMANDS]

    def __iter__(self):
        yield from COMMANDS
        yield from self._unlisted()

    def __len__(self) -> int:
        return len(COMMANDS) + len(self._unlisted())

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self.built

    def __getitem__(self, name: str):
        if name not in self.built and name in COMMANDS:
            importlib.import_module(f"kvsim.cli.{COMMANDS[name][0]}")
            # every command registered so far, option checks installed (KvsimGroup)
            for other, command in typer.main.get_group(app).commands.built.items():
                self.built.setdefault(other, command)
        return self.built[name]

    def __setitem__(self, name: str, command) -> None:
        self.built[name] = command

    def __delitem__(self, name: str) -> None:
        del self.built[name]

    def listed(self, name: str):
        """What the root's --help lists for ``name``: the command when built, else a
        stand-in with its name and first paragraph (its module is not imported)."""
        if name in self.built or name not in COMMANDS:
            return self.built.get(name)
        _module, hidden, text = COMMANDS[name]
        return TyperCommand(name=name, help=text, hidden=hidden)


class _LazyGroup(KvsimGroup):
    """The root group with :class:`_Commands`: a command's module is imported when the
    command is resolved, never to list it in the root's --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Commands(self.commands)
        self._listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if self._listing:
            return self.commands.listed(cmd_name)
        return self.commands.get(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            return super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="kvsim",
    cls=_LazyGroup,
    help="Trace-driven simulator and policy lab for LLM KV-cache memory "
    "(HBM / DRAM / CXL / NVMe).  Docs: README.md and docs/ in the source repository "
    "(start with docs/cli.md; kv_deadline_scheduler users: docs/migrating-from-kvmi.md).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the kvsim version and exit.")] = False,
) -> None:
    """kvsim: replay KV-cache block events through tiered memory under placement policies."""
    from kvsim.cli import common
    from kvsim.jit.notice import on_cold_compile

    # the first compiled run says why it waits (docs/simulate.md, "Engines"); rich's console
    # is made (imported) only then
    on_cold_compile(lambda message: common.err_console.print(message, highlight=False,
                                                               soft_wrap=True))  # one line


def main() -> None:
    """Console-script entry point.

    The command runs as typer runs it (its exit code, ``KvsimInputError`` as one line and
    exit 2); then the process ends without the interpreter's final teardown: the
    ``atexit`` handlers run (worker pools, temporary folders) and the standard streams are
    flushed, but the objects left alive are not freed one by one.  After a cold compile
    that freeing of numba's and LLVM's code libraries took ~0.7 s of the README job's wall
    time, spent after the output was written (docs/benchmarks.md, "Cold compile").  An
    uncaught exception (a bug) still ends the ordinary way, traceback and all."""
    from kvsim.cli.common import INTERRUPTED, TERMINATED
    from kvsim.core.errors import Terminated

    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:  # before the command ran (typer building it): one line
        sys.stderr.write(f"error: {INTERRUPTED}\n")
        code = 130
    except Terminated:
        sys.stderr.write(f"error: {TERMINATED}\n")
        code = 143
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
        code = 1
    _fast_exit(code or 0)


def _fast_exit(code: int) -> None:
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: the interpreter would ignore it too
            pass
    os._exit(code)
