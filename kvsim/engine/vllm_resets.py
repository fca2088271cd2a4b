"""vLLM's scheduler recording's prefix-cache resets as the closed loop's resets table
(``vs[VS_RESETS]`` of :func:`kvsim.engine.vllm_rows.vllm_rows`, which runs them)."""

from __future__ import annotations

import numpy as np

# columns of the resets table ``vs[VS_RESETS]`` (:func:`reset_table`): the engine step
# before whose schedule() it runs (-1: none), the request (table row) before whose arrival
# it runs (-1: none), reset_running_requests (0/1), and 1 once it has run
RS_AT_STEP, RS_BEFORE, RS_RUNNING, RS_DONE = range(4)


def reset_table(resets, num_requests: int) -> np.ndarray:
    """The resets table of :func:`kvsim.engine.vllm_rows.vllm_rows` from a list of vLLM scheduler recording actions
    (``{"at_step": k}`` or ``{"before_arrival_of": row}``, ``reset_running_requests``): a
    reset before engine step ``k``'s schedule() (steps that schedule nothing are not steps),
    or before request ``row`` (a table row) arrives."""
    from kvsim.core.errors import KvsimInputError

    rs = np.full((len(resets), 4), -1, np.int64)
    for k, a in enumerate(resets):
        if "before_arrival_of" in a:
            row = int(a["before_arrival_of"])
            if not 0 <= row < num_requests:
                raise KvsimInputError(f"reset before_arrival_of: expected a request row in "
                                      f"0..{num_requests - 1}, got {row}", field="resets")
            rs[k, RS_BEFORE] = row
        elif "at_step" in a and int(a["at_step"]) >= 0:
            rs[k, RS_AT_STEP] = int(a["at_step"])
        else:
            raise KvsimInputError("reset: expected at_step >= 0 or before_arrival_of",
                                  field="resets")
        rs[k, RS_RUNNING] = int(bool(a.get("reset_running_requests", False)))
        rs[k, RS_DONE] = 0
    return rs
