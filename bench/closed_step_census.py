"""How a closed-loop run's engine steps were run (vLLM's scheduler, compiled engine): how many
went through the quiet-step fast path (:mod:`kvsim.replay.kernel.closed_ffwd`), how many of
those cached a block, how many were left to the full path because their caching could admit
the first waiting request, and how many ran the full path (``schedule()`` / the core).

    python bench/closed_step_census.py -- simulate --request-trace T --block-size 512 ...

Runs the kvsim command in this process and prints one JSON line per replica on stderr, from
the step driver's aux columns (:mod:`kvsim.replay.kernel.closed_step`, ``X_QUIET`` ...),
read when each replica's engine finishes (the Engine's ``finish`` wrapped here; nothing of
kvsim's compiled code changes).  Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from kvsim.cli import app
    from kvsim.modes.closed import closed_loop
    from kvsim.replay.kernel import closed_step as CS

    seen: list[dict] = []
    finish = closed_loop.Engine.finish

    def counted(self) -> None:
        finish(self)
        a = self.aux
        steps = int(a[CS.X_NINSYS])
        seen.append({"steps": steps, "quiet": int(a[CS.X_QUIET]),
                     "quiet_cached_a_block": int(a[CS.X_QCACHE]),
                     "left_full_head_could_move": int(a[CS.X_QHEAD]),
                     "full": steps - int(a[CS.X_QUIET])})

    closed_loop.Engine.finish = counted
    argv = sys.argv[1:]
    sys.argv = ["kvsim", *argv[argv.index("--") + 1:]]
    try:
        app()
    except SystemExit:
        pass
    finally:
        closed_loop.Engine.finish = finish
    for k, rec in enumerate(seen):
        print(json.dumps({"replica": k, **rec}), file=sys.stderr)


if __name__ == "__main__":
    main()
