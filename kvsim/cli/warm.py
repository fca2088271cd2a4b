"""``kvsim warm``: compile the replay core into numba's disk cache now, so that the first run
loads it instead of compiling (docs/jit.md, "Compiling ahead: kvsim warm").

API: :func:`kvsim.modes.warm.warm` (returns :class:`kvsim.modes.warm.WarmResult`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from kvsim.cli import app
from kvsim.cli.common import JsonOption, comma_names, emit_json, err_console, out_console


@app.command("warm")
def warm_command(
    scheduler: Annotated[str, typer.Option(
        "--scheduler", metavar="vllm|kvsim|all",
        help="The closed loop's scheduler(s) to compile the step driver for: vllm (what "
             "every run uses unless --scheduler kvsim), kvsim, or all.")] = "vllm",
    policies: Annotated[str | None, typer.Option(
        "--policies", metavar="A,B,...",
        help="Policies whose hooks to compile (default: every registered one).",
        show_default=False)] = None,
    json_: JsonOption = False,
) -> None:
    """Compile the replay core into numba's disk cache now (once after pip install), so the
    first simulate / compare loads it instead of compiling.

    It compiles the replay core, the closed loop's step driver, every policy's hooks and
    the scheduler that generate and import-request-trace run (about a minute on 2 cores,
    once per installed kvsim version) by serving a few requests of the README's profile
    under every policy and lowering them; a no-op (a few seconds) when the cache is already
    filled.  docs/jit.md, "Compiling ahead: kvsim warm"."""
    from kvsim.modes.warm import SCHEDULERS, check_schedulers, warm

    scheds = SCHEDULERS if scheduler == "all" else tuple(s.strip() for s in scheduler.split(","))
    names = comma_names("--policies", policies)
    check_schedulers(scheds, names)  # before saying anything
    if not json_:
        err_console.print("compiling into numba's disk cache (about a minute on 2 cores when "
                          "cold)", soft_wrap=True, markup=False)
    res = warm(scheds, names)
    if json_:
        emit_json({"cache_dir": res.cache_dir, "cold": res.cold, "wall_s": res.wall_s,
                   "cpu_s": res.cpu_s})
        return
    was = ", ".join(f"{s}: {'compiled' if c else 'already cached'}" for s, c in res.cold.items())
    out_console.print(f"numba cache {res.cache_dir} filled ({was}); {res.wall_s:.1f} s wall, "
                      f"{res.cpu_s:.1f} CPU-s", soft_wrap=True, markup=False)
