"""Request slots: the replay core's per-request tables (``R_i``, ``R_f``) indexed by a slot
that a request holds while it can still change, not by its request id, so that they follow
the requests in flight rather than the trace's length (issue 38, "Memory grows with what is
resident, not with the trace").

The driver (:mod:`kvsim.replay.driver`) hands the core each batch with its
``request_id`` / ``parent_request_id`` columns rewritten to slots (:meth:`RequestSlots.mapped`;
the core is unchanged: a slot is a request id to it).  After each batch,
:meth:`RequestSlots.release` folds the finished requests' rows into the per-request results
(:class:`FoldedRequests`: the columns of :data:`kvsim.replay.metrics.REQUEST_COLUMNS`, at most
:data:`FOLD_MEM_ROWS` rows in memory, the rest in a temporary file,
:class:`kvsim.core.spill.SpilledRows`) and frees their slots for new requests.  A finished
request's slot is kept while anything may still write its row or name it:

* an HBM block it allocated (``H_i``'s owner: an eviction of that block counts against its
  ``evictions_suffered``, and the decision log names the owner);
* with the decision log on, a lower-tier block it brought in (the log names the owner);
* a first-token or deadline entry of the step not closed yet (``P``), the gathered
  admission, the running list, the ``vllm_offload`` wait list (``RI_OFF_PEND``).

Slots are recycled only when the pre-pass found that no row names a request after its FREE
row (:attr:`kvsim.replay.prepass.TraceFacts.ids_final`); otherwise a slot is the request id
itself, as before.  Either way the outputs are the same, byte for byte: every value of a
request's row is final when it is folded, the decision log's request ids are translated
back before the slot is reused, and the per-request statistics do not depend on the rows'
order (:meth:`FoldedRequests.figures`; the per-request table is sorted by request id).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvsim.core import layout as L
from kvsim.core.spill import SpilledRows, exact_stats
from kvsim.replay.id_map import IdMap

if TYPE_CHECKING:  # pandas is imported only where a DataFrame is built
    import pandas as pd

#: Folded request rows kept in memory before they go to the temporary file (26 columns of
#: 8 bytes: 1.7 MB).  The Mooncake conversation trace (12,031 requests) spills ~3.8k of them.
FOLD_MEM_ROWS = 1 << 13


def _column_kinds() -> dict[str, str]:
    """numpy dtype kind ('f', 'i', 'b') of each per-request column."""
    from kvsim.replay.metrics import REQUEST_COLUMNS

    ri, rf = L.new_request_tables(1)
    one = np.zeros(1, dtype=np.int64)
    return {name: np.asarray(col(ri, rf, one)).dtype.kind
            for name, col in REQUEST_COLUMNS.items()}


class FoldedRequests:
    """The per-request results of a replay: one row per request that arrived or ran (the
    rows of :func:`kvsim.replay.metrics.request_table`, in the order they were folded), each
    column 8 bytes (float64, or int64 bits for integer and boolean columns), in bounded
    memory."""

    def __init__(self) -> None:
        self.kinds = _column_kinds()
        self.names = list(self.kinds)
        self.rows = SpilledRows(len(self.names), FOLD_MEM_ROWS)

    def append(self, R_i: np.ndarray, R_f: np.ndarray, slots: np.ndarray,
               rids: np.ndarray) -> None:
        from kvsim.replay.metrics import REQUEST_COLUMNS

        if not len(slots):
            return
        chunk = np.empty((len(slots), len(self.names)), dtype=np.float64)
        bits = chunk.view(np.int64)
        for j, name in enumerate(self.names):
            v = rids if name == "request_id" else REQUEST_COLUMNS[name](R_i, R_f, slots)
            if self.kinds[name] == "f":
                chunk[:, j] = v
            else:
                bits[:, j] = np.asarray(v).astype(np.int64)
        self.rows.append(chunk)

    def _col(self, chunk: np.ndarray, name: str) -> np.ndarray:
        j = self.names.index(name)
        if self.kinds[name] == "f":
            return chunk[:, j]
        v = chunk.view(np.int64)[:, j]
        return v.astype(bool) if self.kinds[name] == "b" else v

    def frame(self) -> pd.DataFrame:
        """:func:`kvsim.replay.metrics.request_table`: one row per request, by request id."""
        a = self.rows.to_array()
        order = np.argsort(a.view(np.int64)[:, self.names.index("request_id")],
                           kind="stable")
        a = a[order]
        import pandas as pd

        return pd.DataFrame({name: self._col(a, name) for name in self.names})

    def figures(self, measured: np.ndarray | None, block_size_tokens: int) -> dict:
        """What :func:`kvsim.replay.metrics.summarize` reads of the per-request table, over
        the requests in ``measured`` (None: all), chunk by chunk: counts and sums (exact in
        any order) and the TTFT / TPOT / end-to-end percentiles (exact:
        :func:`kvsim.core.spill.exact_stats`)."""
        bs = max(int(block_size_tokens), 1)
        rid = self.names.index("request_id")

        def keep(chunk: np.ndarray) -> np.ndarray:
            return np.isin(chunk.view(np.int64)[:, rid], measured)

        f = dict(requests=0, lookup_tokens=0, prompt_blocks=0, ttft_missed=0,
                 tpot_missed=0, missed_any=0,
                 hit=[0, 0, 0, 0])
        for chunk in self.rows.iter_chunks():
            if measured is not None:
                chunk = chunk[keep(chunk)]
            look = self._col(chunk, "lookup_tokens")
            prompt = self._col(chunk, "prompt_tokens")
            tm = self._col(chunk, "ttft_missed")
            pm = self._col(chunk, "tpot_missed_tokens")
            f["requests"] += len(chunk)
            f["lookup_tokens"] += int(look.sum())
            for t, c in enumerate(("hbm_hit_tokens", "dram_hit_tokens", "cxl_hit_tokens",
                                   "nvme_hit_tokens")):
                f["hit"][t] += int(self._col(chunk, c).sum())
            f["prompt_blocks"] += int(((prompt[look > 0] + bs - 1) // bs).sum())
            f["ttft_missed"] += int(tm.sum())
            f["tpot_missed"] += int(pm.sum())
            f["missed_any"] += int((tm | (pm > 0)).sum())
        for name in ("ttft_us", "tpot_us", "e2e_us"):
            f[name] = exact_stats(self.rows, self.names.index(name), (50, 99),
                                  None if measured is None else keep)[2]
        return f


def new_link_rows() -> SpilledRows:
    """The (request id, transfers, queue wait) rows of a slot map's folded requests."""
    return SpilledRows(3)


class RequestSlots:
    """Request id <-> slot of the core's request tables, and the folded results (module
    docstring).  ``recycle`` False: slot = request id, nothing is folded before the end."""

    def __init__(self, max_request_id: int, recycle: bool) -> None:
        self.recycle = bool(recycle)
        # request id -> slot, for the ids holding one (a hash map: sized by the slots in
        # use, not by the largest request id)
        self.slot_of = IdMap() if self.recycle else None
        self.rid_of = np.full(64, -1, dtype=np.int64)  # slot -> request id (-1: free)
        self.free: list[int] = []  # released slots, the lowest last (popped first)
        self.top = 0  # slots ever used
        self.folded = FoldedRequests()
        # (request id, transfers, queue wait) of the folded requests with a transfer, kept
        # only under the queue link model (its summary reads them; kvsim.replay.link_metrics)
        # and in bounded memory (24 bytes a request with a transfer, past MEM_ROWS in a file)
        self.link = new_link_rows()
        self.log_mark = 0  # decision-log buffer rows already translated to request ids
        self.closed = False

    def _assign(self, rids: np.ndarray) -> None:
        got = np.empty(len(rids), dtype=np.int64)
        for k, rid in enumerate(rids.tolist()):
            if self.free:
                s = self.free.pop()
            else:
                s = self.top
                self.top += 1
                if s >= len(self.rid_of):
                    self.rid_of = L.grow_rows(self.rid_of, 2 * len(self.rid_of), -1)
            self.rid_of[s] = rid
            got[k] = s
        self.slot_of.put(rids, got)

    def mapped(self, cols: dict) -> dict:
        """The batch ``cols`` with its request ids as slots (new requests get one)."""
        if not self.recycle:
            return cols
        out = dict(cols)
        for name in ("request_id", "parent_request_id"):
            ids = cols[name]
            m = np.empty(len(ids), dtype=np.int64)  # every element written by map_into
            if self.slot_of.map_into(ids, m):  # new requests: slots in id order
                self._assign(np.unique(ids[(m < 0) & (ids >= 0)]))
                self.slot_of.map_into(ids, m)
            out[name] = m
        return out

    def translate_log(self, G, n: int) -> None:
        """Rows ``log_mark .. n-1`` of the decision-log buffer ``G``: slots -> request ids."""
        if not self.recycle or n <= self.log_mark:
            return
        lo = self.log_mark
        req = G[0][lo:n, L.GI_REQ]  # views: translated in place
        pos = req >= 0
        req[pos] = self.rid_of[req[pos]]
        cand = G[2][lo:n, :, L.CI_REQ]  # the runners-up written (GI_NCAND of each row)
        pos = (np.arange(cand.shape[1])[None, :] < G[0][lo:n, L.GI_NCAND][:, None]) & \
            (cand >= 0)
        cand[pos] = self.rid_of[cand[pos]]
        self.log_mark = n

    def _fold(self, run, slots: np.ndarray, rids: np.ndarray) -> None:
        self.folded.append(run.R_i, run.R_f, slots, rids)
        if int(run.K[L.K_LINK_QUEUE]) == 0:
            return
        xf = run.R_f[slots, L.RF_XFERS]
        k = xf > 0
        if k.any():
            self.link.append(np.column_stack((rids[k].astype(np.float64), xf[k],
                                              run.R_f[slots[k], L.RF_QWAIT_US])))

    def fold_done(self, run) -> tuple[np.ndarray, np.ndarray]:
        """Fold the finished requests no longer named anywhere (an HBM block they own, the
        pending buffer, the running list, a gathered admission, with a decision log a
        lower-tier block) and blank their rows; returns ``(slots, request ids)`` of the
        rows now free (empty when none), which the caller returns to its free list (the
        core is between calls)."""
        n = self.top
        R_i, C = run.R_i, run.C
        none = np.zeros(0, dtype=np.int64)
        cand = (R_i[:n, L.RI_STATE] == L.RS_DONE) & (R_i[:n, L.RI_OFF_PEND] == 0) & \
            (self.rid_of[:n] >= 0)
        if not cand.any():
            return none, none
        busy = np.zeros(n, dtype=np.bool_)
        named = [run.H_i[:, L.HI_OWNER], run.P[:int(C[L.C_NPEND]), 0],
                 run.running[:int(C[L.C_NRUN])], np.array([int(C[L.C_PEND_ADMIT])])]
        if run.log_writer is not None:
            named += [T.L_i[:, L.LI_OWNER] for T in run.T]
        for v in named:
            busy[v[(v >= 0) & (v < n)]] = True
        slots = np.flatnonzero(cand & ~busy)
        if not len(slots):
            return none, none
        if run.log_writer is not None:
            self.translate_log(run.G, int(C[L.C_NLOG]))
        rids = self.rid_of[slots].copy()
        self._fold(run, slots, rids)
        ri0, rf0 = L.new_request_tables(1)
        R_i[slots] = ri0[0]
        run.R_f[slots] = rf0[0]
        return slots, rids

    def release(self, run) -> None:
        """Fold the finished requests no longer named anywhere; free their slots (after a
        batch: the core is between calls)."""
        if not self.recycle or not self.top:
            return
        slots, rids = self.fold_done(run)
        if len(slots):
            self.slot_of.drop(rids)
            self.rid_of[slots] = -1
            self.free.extend(slots[::-1].tolist())

    def close(self, run) -> FoldedRequests:
        """After the last row: fold every request left (the ones that arrived or ran);
        the core's request tables are dropped."""
        n = self.top if self.recycle else run.R_i.shape[0]
        step = 1 << 16
        for lo in range(0, n, step):
            s = lo + np.flatnonzero(run.R_i[lo:lo + step, L.RI_STATE] != L.RS_UNSEEN)
            if self.recycle:
                s = s[self.rid_of[s] >= 0]
            self._fold(run, s, self.rid_of[s].copy() if self.recycle else s.copy())
        run.R_i, run.R_f = L.new_request_tables(0)
        self.slot_of = None
        self.closed = True
        return self.folded

    def link_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request ids, transfers, queue wait) of the requests with a queued transfer
        (``--link-model queue``), by request id."""
        a = self.link.to_array()
        a = a[np.argsort(a[:, 0], kind="stable")]
        return a[:, 0].astype(np.int64), a[:, 1], a[:, 2]
