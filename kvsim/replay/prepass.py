"""The replay's pre-pass and the two per-ALLOCATE facts it used to hold for a whole trace.

:func:`scan_trace` streams the event file once for the sizes of the core's buffers
(:class:`TraceFacts`) and, per ALLOCATE row, one bit: ``seen`` (was the same full, hashed
content allocated before?  The recompute metric needs it), from a :class:`SeenSet` of the
content hashes met so far that lives only while the pass runs (11 to 21 bytes per distinct
hash, open addressing at load <= 3/4) and is freed before the replay starts.  The replay
then reads 1 bit per ALLOCATE row (1.2 MB for the 9.3 M ALLOCATE rows of the Mooncake
16-token import) instead of the set (64 MiB there), batch by batch, from a
:class:`kvsim.core.spill.PackedBits` (in memory up to 256 KiB, then in a temporary file: 52 MB
for 100x the Mooncake 512-token import would otherwise stay resident through the replay).
The other per-ALLOCATE input of the core is produced batch by batch:

* ``next_use`` (ordinal of the next ALLOCATE of the same content: Belady's offline bound
  reads the future) by :func:`offline_next_use`, one more streaming pass, only when an
  offline policy runs.  It is the one whole-trace array left: 8 bytes per ALLOCATE row
  (plus a hash map of the distinct hashes while it is built), the documented exception.

Before this split the pre-pass held every ALLOCATE row's hash, then sorted them
(~59 bytes per ALLOCATE row at its peak, for every policy).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import njit

from kvsim.core.heap import trim_heap
from kvsim.core.schema import EventKind
from kvsim.core.spill import IntsFile, PackedBits, SpilledRows
from kvsim.events.seen_set import _EMPTY, SeenSet, _grown, _slot
from kvsim.jit.disk_cache import setup_func
from kvsim.policy.api import NEVER
from kvsim.replay import facts_cache

EV_ARRIVE, EV_ALLOCATE, EV_ACCESS, EV_FORK, EV_FREE = (
    int(EventKind.ARRIVE), int(EventKind.ALLOCATE), int(EventKind.ACCESS), int(EventKind.FORK),
    int(EventKind.FREE))


@dataclass
class TraceFacts:
    """What one pre-pass over the event file learns (shared by every policy of a compare)."""

    num_rows: int
    first_step: int
    last_step: int
    max_request_id: int
    max_blocks_per_request: int
    max_concurrent_requests: int
    max_size_bytes: int
    num_allocs: int  # ALLOCATE rows in the trace
    #: int64 per ALLOCATE ordinal: ordinal of the next ALLOCATE of the same (full, hashed)
    #: content, NEVER if none.  None until an offline policy needs it
    #: (:func:`offline_next_use`, filled in by :func:`kvsim.replay.driver.execute`).
    next_use: np.ndarray | None = None
    #: request ids in arrival order: by the time of the request's ARRIVE row (or, without
    #: one, of its first ALLOCATE / ACCESS / FORK row), ties by request id (int32 when
    #: every id fits, else int64; beyond :data:`ARRIVALS_MEM` requests in a temporary
    #: file, :class:`kvsim.core.spill.IntsFile`, read only for a warm-up)
    arrival_order: np.ndarray | IntsFile = field(
        default_factory=lambda: np.zeros(0, np.int64))
    #: step of that row, per entry of ``arrival_order`` (int32 when every step fits)
    arrival_step: np.ndarray | IntsFile = field(
        default_factory=lambda: np.zeros(0, np.int64))
    #: the ``seen`` flag of each ALLOCATE ordinal (was the same full, hashed content
    #: allocated before?) as packed bits (bit ``o & 7`` of byte ``o >> 3``): 1 bit per
    #: ALLOCATE row, filled by :func:`scan_trace`, in a temporary file once large; None
    #: when the facts were made elsewhere (the replay then keeps a :class:`SeenSet` itself)
    seen_bits: PackedBits | None = None
    #: no row names a request id (as its request or as a parent) after that request's
    #: FREE row: the replay may then recycle a finished request's slot
    #: (:class:`kvsim.replay.slots.RequestSlots`); False when unknown
    ids_final: bool = False
    #: at most this many distinct content hashes reach the lower tiers (-1: unknown, then
    #: ``num_allocs``): their slots (kvsim.replay.lower_tiers); set by the closed loop
    max_distinct_hashes: int = -1

    def seen_at(self, base: int, m: int) -> np.ndarray:
        """The ``seen`` flags (int8) of ALLOCATE ordinals ``base .. base + m - 1``."""
        return self.seen_bits.get(base, m)

    @property
    def num_requests(self) -> int:
        return int(len(self.arrival_order))

    def warmup_step(self, warmup: int) -> int:
        """The step the measurement window starts at: the arrival step of request number
        ``warmup`` in arrival order (-1 = no warm-up)."""
        if warmup <= 0 or warmup >= len(self.arrival_order):
            return -1
        return int(self.arrival_step[warmup])

    def measured_requests(self, warmup: int) -> np.ndarray:
        """Ids of the requests measured after ``warmup`` warm-up requests."""
        return self.arrival_order[max(int(warmup), 0):]


def _open(path):
    from kvsim.events import open_events

    return open_events(path)


def release_read_buffers() -> None:
    """Give the decoded row groups of a finished pass (or batch) back to the OS.  Arrow's
    allocator (mimalloc) keeps freed blocks for reuse, and so does glibc's malloc for the
    numpy temporaries of the batch checks: after the pre-pass over the Mooncake 16-token
    import the process held ~250 MiB (Arrow) + ~70 MiB (malloc) of freed memory that the
    replay's own arrays could not reuse (docs/benchmarks.md, "Memory: streaming replay").
    Costs a few milliseconds."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    trim_heap()


#: Resident growth past which the replay's pass gives its read buffers back after a batch
#: (:class:`BufferRelease`): 64 MiB, about two decoded 2^18-row batches of the 20 columns
#: the core reads (~106 bytes a row).  Below it the next batches reuse the freed buffers;
#: giving them back after every batch had each batch fault and zero them again
#: (docs/benchmarks.md, "16-token replay: read buffers kept, pandas not imported").
RELEASE_SLACK_BYTES = 64 << 20


def _rss_bytes() -> int | None:
    """This process's resident set (``/proc/self/statm``), or None where it is not there."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


class BufferRelease:
    """:func:`release_read_buffers` after a batch only once the resident set has grown by
    more than ``slack_bytes`` since the last release (every batch where the resident set
    cannot be read).  What a pass holds beyond its live data stays under ``slack_bytes``
    plus one batch, whatever the trace's length (the memory bound of issue 38)."""

    def __init__(self, slack_bytes: int | None = None) -> None:
        self.slack_bytes = RELEASE_SLACK_BYTES if slack_bytes is None else slack_bytes
        self.mark = _rss_bytes()
        self.releases = 0

    def after_batch(self) -> None:
        rss = _rss_bytes()
        if rss is None or self.mark is None or rss > self.mark + self.slack_bytes:
            release_read_buffers()
            self.releases += 1
            self.mark = _rss_bytes()


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def full_hashes(cols: dict, block_size_tokens: int) -> np.ndarray:
    """The content hash of each ALLOCATE row of a batch, in row order: the hash of the
    block's *full* content, also on a row that allocates the block partial (a decode
    block), because the replay caches such a block under that hash once its request
    appends the next block (docs/simulate.md).  A partial block whose request finishes
    before it fills is never cached, yet counts here as an allocation of its content (so a
    later full block of that content is ``seen``: the one approximation, documented).
    ``block_size_tokens`` is kept for callers; every row's hash is used."""
    alloc = cols["kind"] == EventKind.ALLOCATE
    return cols["content_hash"][alloc].astype(np.int64)


#: Requests whose arrival arrays stay in memory (0.5 MB); a longer trace's go to a
#: temporary file (100x the Mooncake conversation trace: 1.2 M requests, 9.6 MB at int32,
#: that the replay would hold and never read without a warm-up).
ARRIVALS_MEM = 1 << 16


def _narrow(a: np.ndarray, mem: int) -> np.ndarray | IntsFile:
    """``a`` as int32 when every value fits (8 bytes per request instead of 16), in a
    temporary file when longer than ``mem``."""
    if not (len(a) and (int(a.min()) < -(1 << 31) or int(a.max()) >= 1 << 31)):
        a = a.astype(np.int32)
    return IntsFile(a) if len(a) > mem else a


#: The columns :func:`scan_trace` reads (8 of 22: ~1/4 of the decoding and checking).
SCAN_COLUMNS = ("step", "time_us", "kind", "request_id", "block_index", "content_hash",
                "parent_request_id", "size_bytes")


def scan_trace(trace_path: str | Path, block_size_tokens: int,
               batch_rows: int = 1 << 20, bits_mem_bytes: int | None = None,
               arrivals_mem: int | None = None, *, columns=None) -> TraceFacts:
    """The facts of :func:`_scan`, loaded instead when a pass over the same bytes (with the
    same code and ``columns``) stored them (:mod:`kvsim.replay.facts_cache`; a miss hashes
    the file first: 0.12 s for 102 MB), else scanned and stored."""
    if arrivals_mem is None:
        arrivals_mem = ARRIVALS_MEM
    entry, fields = facts_cache.lookup(trace_path, block_size_tokens, columns, bits_mem_bytes,
                                       arrivals_mem, _narrow)
    if fields is not None:
        return TraceFacts(**fields)
    facts = _scan(trace_path, batch_rows, bits_mem_bytes, arrivals_mem, columns)
    facts_cache.store(entry, facts)
    return facts


def _scan(trace_path, batch_rows: int, bits_mem_bytes: int | None, arrivals_mem: int,
          columns) -> TraceFacts:
    """One streaming pass for the sizes of the core's buffers, the requests' arrival
    order and the ALLOCATE rows' ``seen`` flags.  ``columns``: None reads and checks every
    column (an input error is raised here, before any replay); :data:`SCAN_COLUMNS` reads
    and checks only what the pass uses, for a caller whose replay then reads and checks the
    whole file in the same process (:func:`kvsim.replay.driver.execute`: an error in
    another column is raised by the replay's read, naming the same file, row and field).
    Memory: one batch, per request id two
    flags (2 bytes) and its first row's id, time and step (24 bytes, in a temporary file
    beyond ``arrivals_mem`` requests, read back and sorted once the scan's batches are freed;
    8 bytes kept, int32, or none in memory beyond ``arrivals_mem``), 1 bit per ALLOCATE row
    (``seen_bits``, in a temporary file beyond ``bits_mem_bytes``) and, while the pass
    runs, a :class:`SeenSet` of the distinct content hashes (freed at its end)."""
    num_rows = 0
    num_allocs = 0
    first_step = -1
    last_step = -1
    max_req = -1
    max_blocks = 0
    max_size = 0
    live = 0
    max_live = 0
    started = np.zeros(0, dtype=np.int8)  # 0 no, 1 started, 2 finished, 3 both never
    known = np.zeros(0, dtype=np.bool_)
    # each request's first row (id, time_us, step), in a temporary file past arrivals_mem
    # rows: held in memory during the scan they were the one part of its peak that grew
    # with the trace (24 bytes a request: +29 MB at 100x the Mooncake trace)
    firsts = SpilledRows(3, arrivals_mem, dtype=np.int64)
    seen_set = SeenSet()
    seen_bits = PackedBits(bits_mem_bytes)
    acc = np.zeros(6, np.int64)  # _scan_rows' running values
    scan_rows = setup_func(_scan_rows)  # Python on the interpreted engine, cold
    with _open(trace_path) as reader:
        for cols in reader.batches(batch_rows, read_ahead=True, columns=columns):
            n = len(cols["kind"])
            if n == 0:
                continue
            kind = cols["kind"]
            seen_bits.append(seen_set.mark_rows(kind, cols["content_hash"]))
            num_rows += n
            req = cols["request_id"]
            if first_step < 0:
                first_step = int(cols["step"][0])
            last_step = int(cols["step"][-1])
            top = int(max(req.max(), cols["parent_request_id"].max()))
            max_req = max(max_req, top)
            if top >= len(started):
                grown = np.zeros(max(top + 1, 2 * len(started)), dtype=np.int8)
                grown[: len(started)] = started
                started = grown
                grown = np.zeros(len(started), dtype=np.bool_)
                grown[: len(known)] = known
                known = grown
            # arrivals, ALLOCATE maxima and concurrency in one compiled pass over the rows
            fr = np.empty(n, np.int64)
            ft = np.empty(n, np.int64)
            fs = np.empty(n, np.int64)
            acc[:5] = (live, max_live, 0, max_blocks, max_size)
            m = scan_rows(kind, req, cols["parent_request_id"], cols["block_index"],
                          cols["size_bytes"], cols["time_us"], cols["step"], known, started,
                          acc, fr, ft, fs)
            if m:
                firsts.append(np.stack((fr[:m], ft[:m], fs[:m]), axis=1))
            live, max_live, k, max_blocks, max_size = (int(x) for x in acc[:5])
            num_allocs += k
    del seen_set  # ~11-21 bytes per distinct hash, freed before the replay starts
    seen_bits.finish()
    release_read_buffers()
    if len(firsts):
        # read back once the batches and the hash set are gone: 32 bytes a request here,
        # below the scan's peak
        rows = firsts.to_array()
        firsts.close()
        order = np.lexsort((rows[:, 0], rows[:, 1]))  # by arrival time, then id
        arrival_order = _narrow(rows[order, 0], arrivals_mem)
        arrival_step = _narrow(rows[order, 2], arrivals_mem)
        del rows, order
        # those temporaries (40 bytes a request) may have come from the heap (glibc's
        # mmap threshold rises as large blocks are freed): given back, or the replay
        # starts ~28 MB higher at 100x the Mooncake trace (docs/benchmarks.md, "Memory:
        # 1x, 10x, 100x the Mooncake trace")
        trim_heap()
    else:
        arrival_order = arrival_step = np.zeros(0, np.int64)
    return TraceFacts(num_rows, max(first_step, 0), max(last_step, 0), max_req,
                      max_blocks, max(max_live, 1), max_size, num_allocs, None,
                      arrival_order, arrival_step, seen_bits, ids_final=bool(acc[5] == 0))


@njit(cache=True)
def _scan_rows(kind, req, parent, bi, size, time_us, step, known, started, acc, fr, ft,
               fs):
    """One batch of :func:`scan_trace`, row by row.  ``acc``: (live requests, their
    maximum, this batch's ALLOCATE rows, max ALLOCATE block index + 1, max ALLOCATE size,
    1 once a row names a request after its FREE row), updated.  A request's arrival is its
    ARRIVE row, else its first ALLOCATE / ACCESS / FORK row (ARRIVE precedes the others of
    its request in a valid trace): the first
    of a request not ``known`` yet goes to ``fr`` / ``ft`` / ``fs`` (id, time, step).
    Concurrency: +1 at a request's first ALLOCATE / ACCESS / FORK row (``started``),
    -1 at its FREE row (``block_index`` < 0).  Returns how many arrivals were recorded."""
    live = acc[0]
    max_live = acc[1]
    allocs = 0
    max_blocks = acc[3]
    max_size = acc[4]
    m = 0
    for i in range(kind.shape[0]):
        k = kind[i]
        r = req[i]
        if (r >= 0 and started[r] >= 2) or (parent[i] >= 0 and started[parent[i]] >= 2):
            acc[5] = 1  # a finished request named again: its slot is never recycled
        opens = k == EV_ALLOCATE or k == EV_ACCESS or k == EV_FORK
        if (opens or k == EV_ARRIVE) and not known[r]:
            known[r] = True
            fr[m] = r
            ft[m] = time_us[i]
            fs[m] = step[i]
            m += 1
        if k == EV_ALLOCATE:
            allocs += 1
            if bi[i] + 1 > max_blocks:
                max_blocks = bi[i] + 1
            if size[i] > max_size:
                max_size = size[i]
        if opens:
            if started[r] == 0 or started[r] == 3:
                started[r] = 1
                live += 1
        elif k == EV_FREE and bi[i] < 0:
            live -= 1
            if bi[i] == -1 and r >= 0:  # the request is done (not a preemption, a reset):
                if started[r] <= 1:
                    started[r] = 2 if started[r] == 1 else 3  # 3: done, never started
        else:
            continue
        if live > max_live:
            max_live = live
    acc[0] = live
    acc[1] = max_live
    acc[2] = allocs
    acc[3] = max_blocks
    acc[4] = max_size
    return m


def alloc_full(cols: dict, block_size_tokens: int) -> np.ndarray:
    """Per ALLOCATE row of a batch (row order): is the block full at allocation?  Only a
    full block is looked up, so only a full row can hit (be a *use* for Belady)."""
    alloc = cols["kind"] == EventKind.ALLOCATE
    return (cols["num_tokens"][alloc] == block_size_tokens).astype(np.int8)


@njit(cache=True)
def _link(hashes, full, base, keys, vals, n_used, next_use):
    """Every row with a non-zero hash (ALLOCATE ordinal ``base + k``) waits for the next
    *full* row of that hash (a lookup hits only full blocks): that row's ordinal becomes
    its ``next_use``.  A partial row (a decode block, cached once full) waits too.  The
    waiting rows of a hash form a list headed by ``vals``: each holds ``-2 - previous``
    in ``next_use`` (-1 ends the list); :func:`offline_next_use` turns what is still
    waiting at the end into NEVER.  Returns the new key count."""
    for k in range(hashes.shape[0]):
        h = hashes[k]
        if h == _EMPTY:
            continue
        o = base + k
        i = _slot(keys, h)
        if keys[i] != h:
            keys[i] = h
            vals[i] = -1
            n_used += 1
        elif full[k] != 0:  # a use: every row waiting on this content gets it
            w = vals[i]
            while w >= 0:
                prev = -2 - next_use[w]
                next_use[w] = o
                w = prev
            vals[i] = -1
        next_use[o] = -2 - vals[i]
        vals[i] = o
    return n_used


def offline_next_use(trace_path: str | Path, block_size_tokens: int, num_allocs: int,
                     batch_rows: int = 1 << 20) -> np.ndarray:
    """``next_use`` per ALLOCATE ordinal (see :class:`TraceFacts`), in one streaming pass:
    the array itself (8 bytes per ALLOCATE row) and a map of the distinct hashes.  The
    next use of a row is the next *full* ALLOCATE row of the same content (see
    :func:`_link`)."""
    next_use = np.full(num_allocs, NEVER, dtype=np.int64)
    keys = np.zeros(1 << 12, np.int64)
    vals = np.zeros(1 << 12, np.int64)
    n_used = 0
    base = 0
    with _open(trace_path) as reader:
        for cols in reader.batches(batch_rows, read_ahead=True):
            h = full_hashes(cols, block_size_tokens)
            if base + h.shape[0] > num_allocs:
                raise ValueError("the trace changed since its pre-pass (more ALLOCATE rows)")
            keys, vals = _grown(keys, vals, n_used + h.shape[0])
            n_used = int(_link(h, alloc_full(cols, block_size_tokens), base, keys, vals,
                               n_used, next_use))
            base += h.shape[0]
    next_use[next_use < 0] = NEVER  # still waiting: no later full row of that content
    release_read_buffers()
    return next_use
