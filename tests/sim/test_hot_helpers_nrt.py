"""The small helpers the replay's per-block loops call (the built-in lru's list
operations, the lower tiers' shared table, the HBM prefix index, row copies, the link
queues) are compiled without reference counting (numba ``_nrt=False``): they take plain
arrays and allocate nothing, and with counting on, each call counted every array it
received on entry and on exit (an atomic update each, ~20 per demoted block per tier on
the Mooncake 16-token import; docs/benchmarks.md, "The 16-token replay's per-block
calls").  On main before that change they were compiled with counting."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.memory import fast
from kvsim.policy import structs
from kvsim.replay.kernel import links, spill, tier_ops, tiers

HOT = [
    (structs, "dll_contains"), (structs, "dll_push_tail"), (structs, "dll_push_head"),
    (structs, "dll_remove"), (structs, "dll_move_to_tail"), (structs, "dll_pop_head"),
    (structs, "list_walk"),
    (tiers, "copy_row"), (tiers, "hash_slot"), (tiers, "hash_put"), (tiers, "hash_del"),
    (tiers, "tier_value"), (tiers, "lower_find"),
    (fast, "index_add"), (fast, "index_remove"),
    (links, "submit_up"), (links, "submit_down"), (links, "spill_bytes"),
    (spill, "_drop"), (spill, "_lru_ahead"),  # session 21 (lru9)
    (tiers, "prefetch_lines"), (tier_ops, "_lru_hit"),  # session 19 (core16d)
]


@pytest.mark.parametrize("mod,name", HOT, ids=[f"{m.__name__}.{n}" for m, n in HOT])
def test_hot_helper_compiled_without_counts(mod, name):
    f = getattr(mod, name)
    assert f.targetoptions.get("_nrt") is False, f"{mod.__name__}.{name}"


def test_list_operations_unchanged():
    """Compiled without counts, the list operations still link and unlink as before."""
    prev, nxt = structs.dll_links(4)
    ends = structs.dll_ends()
    for b in range(3):
        structs.dll_push_tail(prev, nxt, ends, np.int64(b))
    structs.dll_remove(prev, nxt, ends, np.int64(1))
    assert (ends[0], ends[1], ends[2]) == (0, 2, 2)
    assert (nxt[0], prev[2]) == (2, 0)
    assert (prev[1], nxt[1]) == (structs.OUT, structs.OUT)
