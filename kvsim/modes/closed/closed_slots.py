"""The closed loop's request slots: a replica's core request tables (``R_i``, ``R_f``) hold
the requests the replica holds at once, not every request of the trace (issue 38, "Memory
grows with what is resident, not with the trace").

The compiled step (:func:`kvsim.replay.kernel.closed_step._fill`) gives a request a row of
the core's tables when one of its rows first reaches the core (its arrival at this
replica): the slot map ``(smap, srid, sfree)`` -- ``smap`` request id -> row (-1: none),
``srid`` row -> request id, ``sfree`` the free rows as a stack after two counters (free
rows, rows ever used) -- is read and written there (:func:`kvsim.engine.vllm_rows.slot_of`),
and the core, the quiet steps (:mod:`kvsim.replay.kernel.closed_ffwd`) and vLLM's CPU
offloading (:mod:`kvsim.replay.kernel.offload`) see a request as its row.  When no row is
free, the step returns ``R_NEED_SLOTS`` and :meth:`ClosedSlots.make_room` folds the
finished requests that nothing names any more into the per-request results (the rule of
the open loop's :class:`kvsim.replay.slots.RequestSlots`: an HBM block it allocated, a
pending first token, the running list, the gathered admission, the ``vllm_offload`` wait
list and, with the decision log, a lower-tier block keep a row), frees their rows, and
doubles the tables when fewer than half of them came free.  So a replica holds a row for
each request in its queue or running and for each finished request that allocated a block
still in its HBM pool: bounded by the pool, not by the trace.

Under vLLM's scheduler its own request state (:mod:`kvsim.engine.vllm_value`: ``R``, the
arrival, the queues, the first token, the mark) has the same rows: a request is given its
row when it arrives at vLLM (:func:`kvsim.engine.vllm_rows.slot_of`, the one maker of the
slot map; ``R_NEED_SLOTS`` when none is free), vLLM names requests by row, and its rows
grow with the core's (:meth:`ClosedSlots.grow`).

With a KV store shared by the replicas (``--shared-tier-gb``, :mod:`kvsim.modes.closed.shared_tier`)
and a decision log, a lower-tier block's owner, which the log names, may be another
replica's row: there a row is the request id (``identity``, every request a row, as before).

The outputs are the same, byte for byte: a folded row is final, the decision log's rows
are translated back to request ids before a row is reused, and :meth:`ClosedSlots.columns`
returns the per-request table in request-id order, as the tables indexed by request id did.
"""

from __future__ import annotations

import numpy as np

from kvsim.core import layout as L
from kvsim.core import row_store
from kvsim.replay.slots import FoldedRequests, RequestSlots, new_link_rows

#: Request-table rows a replica starts with (each row 344 bytes: ``R_i`` 272 + ``R_f`` 72);
#: doubled when more requests are held at once.
FIRST_ROWS = 256


class ClosedSlots(RequestSlots):
    """Request id <-> row of one replica's core request tables (module docstring).  Shares
    :class:`kvsim.replay.slots.RequestSlots`' decision-log translation and folding."""

    def __init__(self, num_ids: int, rows: int = FIRST_ROWS, identity: bool = False) -> None:
        num_ids = max(int(num_ids), 1)
        rows = num_ids if identity else max(int(rows), 1)
        self.recycle = True
        self.identity = bool(identity)  # row = request id (never shared: cluster)
        self.slot_of = None
        # request id -> row: in the run's row store when one is current (kvsim.core.row_store)
        self.smap = row_store.full(num_ids, -1, np.int64)
        self.rid_of = np.full(rows, -1, dtype=np.int64)
        self.sfree = np.zeros(rows + 2, dtype=np.int64)
        if identity:  # row = request id, every row taken: never recycled (a row per id)
            self.smap[:] = self.rid_of[:] = np.arange(num_ids)
            self.sfree[1] = num_ids
        self.folded = FoldedRequests()
        self.link = new_link_rows()  # as RequestSlots (kvsim.replay.slots)
        self.log_mark = 0
        self.closed = False
        #: the engine whose vLLM scheduler's rows are these rows (``vs``, grown with them)
        self.vllm = None

    @property
    def args(self) -> tuple:
        """The slot map as :func:`kvsim.replay.kernel.closed_step.advance` takes it."""
        return (self.smap, self.rid_of, self.sfree)

    @property
    def top(self) -> int:
        return int(self.sfree[1])

    def grow(self, run, rows: int) -> None:
        """The core's request tables and the slot map with at least ``rows`` rows."""
        if rows <= self.rid_of.shape[0]:
            return
        run._grow_requests(rows - 1)
        n = run.R_i.shape[0]
        self.rid_of = L.grow_rows(self.rid_of, n, -1)[:n].copy()
        self.sfree = L.grow_rows(self.sfree, n + 2)[:n + 2].copy()
        if self.vllm is not None:  # vLLM's rows (kvsim.engine.vllm_value.grow_rows)
            from kvsim.engine.vllm_value import grow_rows
            from kvsim.replay.variants import TypedTuple

            self.vllm.vs = TypedTuple(grow_rows(self.vllm.vs, n))

    def release(self, run) -> int:
        """Fold the finished requests no longer named anywhere and free their rows (the
        core is between rows); returns the rows free now."""
        n = self.top
        slots, rids = self.fold_done(run)
        if len(slots):
            self.smap[rids] = -1
            self.rid_of[slots] = -1
            nf = int(self.sfree[0])
            # the stack keeps its lowest row last (taken first), as RequestSlots' list
            stack = np.concatenate([self.sfree[2:2 + nf], slots])
            stack = np.sort(stack)[::-1]
            self.sfree[2:2 + len(stack)] = stack
            self.sfree[0] = len(stack)
        return int(self.sfree[0]) + self.rid_of.shape[0] - n

    def make_room(self, run) -> bool:
        """``R_NEED_SLOTS`` (no row is free): free the rows of finished requests; double
        the tables when none or fewer than half of them are free after that (so a step
        asking again finds more rows each time).  True when the tables were replaced
        (grown), False when rows were freed in place."""
        rows = self.rid_of.shape[0]
        free = self.release(run)
        if free == 0 or free < rows // 2:
            self.grow(run, 2 * rows)
            return True
        return False

    def columns(self, run, replica: int) -> dict:
        """The replica's per-request table (:func:`kvsim.replay.metrics.request_table`) as
        columns, ``replica`` first, in request-id order; every request still held is
        folded first and the core's request tables are dropped."""
        f = self.fold_all(run)
        a = f.rows.to_array()
        a = a[np.argsort(a.view(np.int64)[:, f.names.index("request_id")], kind="stable")]
        cols = {"replica": np.full(len(a), replica, dtype=np.int64)}
        cols.update({name: np.ascontiguousarray(f._col(a, name)) for name in f.names})
        return cols

    def fold_all(self, run) -> FoldedRequests:
        """Fold every request still held (after the run) and drop the core's request
        tables: the replica's per-request rows, in bounded memory."""
        n = self.top
        s = np.flatnonzero((run.R_i[:n, L.RI_STATE] != L.RS_UNSEEN) & (self.rid_of[:n] >= 0))
        self._fold(run, s, self.rid_of[s].copy())
        run.R_i, run.R_f = L.new_request_tables(0)
        self.closed = True
        return self.folded


def one_slot_each(sc) -> None:
    """vLLM's scheduler keeps its own request state (kvsim.engine.vllm_rows): kvsim's
    scheduler's 18 per-slot arrays (``slot_args[:18]``, ``src`` ... ``stall``,
    kvsim.engine.scheduler_state.new_schedule: 144 bytes a request in every replica) are
    not read (``src`` only for a forked slot, which vLLM's never makes), so each is cut to
    one entry of the same type (the same compiled ``advance``)."""
    sc.slot_args = tuple(v[:1].copy() if k < 18 else v for k, v in enumerate(sc.slot_args))
    sc.src = sc.slot_args[0]
