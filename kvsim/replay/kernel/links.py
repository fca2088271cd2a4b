"""Links as queues (``--link-model queue``): every transfer occupies its link.

Each lower tier ``t`` (DRAM, CXL, NVMe, or the cluster's shared tier in that slot) has one
link to HBM per direction (PCIe and network links are full duplex): ``up`` carries
promotions, prefetches and swap-ins, ``down`` spills, demotions, write-throughs.  A
transfer of ``b`` bytes issued at ``issue_us`` occupies its link for

    service = latency_t (once per batched DMA) + b / bandwidth_t

and the link serves its transfers **first in, first out**, one at a time: a transfer starts
at ``max(issue_us, the end of the previous transfer on that link)``.  FIFO is how a DMA
engine queue serves copies: commands issued to one CUDA stream execute in issue order
(CUDA C++ Programming Guide, "Streams"), and vLLM 0.33's CPU offloading keeps one handler
per direction whose every copy job waits for the previous job's end event ("assure job
will start only after the previous one completes": vllm/v1/kv_offload/cpu/gpu_worker.py,
``SingleDirectionOffloadingHandler``).  Work-conserving disciplines (FIFO, processor sharing) end a
busy period at the same moment, and a step waits for all of its transfers, so the step
times of a step that waits for N equal concurrent transfers are the same under either; the
queueing delay of each transfer is FIFO's (docs/cost-model.md, "Links as queues").

The state lives in the cost table ``X[t, X_UP_* / X_DOWN_*]`` (kvsim.core.layout): the
time the link's queue drains (``*_FREE_US``), its busy time, the queueing delay of its
transfers and their count.  With the model off (the default) nothing here is called and
the replay is unchanged.
"""

from __future__ import annotations

from kvsim.core.layout import (
    K_LINK_QUEUE,
    X_DOWN_BUSY_US,
    X_DOWN_BYTES_PER_US,
    X_DOWN_FREE_US,
    X_DOWN_LAT_US,
    X_DOWN_QWAIT_US,
    X_DOWN_XFERS,
    X_UP_BUSY_US,
    X_UP_FREE_US,
    X_UP_QWAIT_US,
    X_UP_XFERS,
)
from kvsim.jit.decorators import njit


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def submit_up(X, t, issue_us, service_us, first):
    """Queue ``service_us`` of transfer on tier ``t``'s up link (lower tier -> HBM), issued at
    ``issue_us``; returns when it starts.  ``first``: the first piece of a batched DMA
    (counted as a transfer, its wait counted as queueing delay; the later pieces of the same
    batch follow it back to back)."""
    start = max(issue_us, X[t, X_UP_FREE_US])
    X[t, X_UP_FREE_US] = start + service_us
    X[t, X_UP_BUSY_US] += service_us
    if first:
        X[t, X_UP_QWAIT_US] += start - issue_us
        X[t, X_UP_XFERS] += 1.0
    return start


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def submit_down(X, t, issue_us, service_us):
    """Queue one spill / demotion / write-through of ``service_us`` on tier ``t``'s down
    link (HBM or the tier above -> tier ``t``); asynchronous: nothing waits for it, it only
    occupies the link.  Returns when it starts."""
    start = max(issue_us, X[t, X_DOWN_FREE_US])
    X[t, X_DOWN_FREE_US] = start + service_us
    X[t, X_DOWN_BUSY_US] += service_us
    X[t, X_DOWN_QWAIT_US] += start - issue_us
    X[t, X_DOWN_XFERS] += 1.0
    return start


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def spill_bytes(K, X, t, now_us, size_bytes):
    """A block of ``size_bytes`` written down into tier ``t`` at ``now_us``: on its down link
    under ``--link-model queue`` (``K[K_LINK_QUEUE]``), else nothing."""
    if K[K_LINK_QUEUE] != 0:
        submit_down(X, t, now_us, X[t, X_DOWN_LAT_US] + size_bytes / X[t, X_DOWN_BYTES_PER_US])
