"""Link metrics of ``--link-model queue`` (kvsim.replay.kernel.links): per lower tier's link,
bytes, utilisation and queueing delay.

Keys added to a run's summary only when the model is on (the default's outputs are
unchanged), for each lower tier ``t`` in ``dram``, ``cxl``, ``nvme`` with a capacity > 0
(or whose link carried a transfer: ``--preemption swap`` uses the DRAM link)
(or ``shared`` for the cluster's shared tier, kvsim.modes.closed.shared_tier):

``link_<t>_up_busy_us`` / ``link_<t>_down_busy_us``
    time the link was busy carrying transfers (service: latency + bytes / bandwidth).
``link_<t>_up_utilisation`` / ``link_<t>_down_utilisation``
    busy time over the run's makespan (per replica, averaged over replicas: each replica
    has its own links).
``link_<t>_up_transfers`` / ``..._down_transfers``
    transfers (up: one batched DMA per tier per admission; down: one per block written).
``link_<t>_up_queue_us`` / ``..._down_queue_us``
    their total queueing delay (start - issue).

and over every transfer up (all tiers: one per request and tier), ``link_queue_p50_us``,
``link_queue_p99_us``, ``link_queue_mean_us`` (the time a request's promotion waited
for the link before it started) and ``link_transfers_up``.  Bytes per link are the existing
``bytes_<t>_link`` keys.
"""

from __future__ import annotations

import numpy as np

from kvsim.core import layout as L

_NAMES = ("dram", "cxl", "nvme")


def link_summary(runs, makespans_us, names=_NAMES, measured=None) -> dict:
    """The keys above from the replays ``runs`` (:class:`kvsim.replay.driver._Run`, one per
    replica) and each one's makespan; ``names``: the label of tiers 1..3; ``measured``: the
    request ids measured (None: all).  Empty when the model is off."""
    if not runs or int(runs[0].K[L.K_LINK_QUEUE]) == 0:
        return {}
    out: dict = {}
    n = len(runs)
    for t, name in enumerate(names, start=1):
        if all(int(r.T[t - 1].Lm[L.LM_CAP]) == 0 and r.X[t, L.X_UP_XFERS] == 0
               and r.X[t, L.X_DOWN_XFERS] == 0 for r in runs):
            continue  # a disabled tier's link, unused (swaps use the DRAM link regardless)
        for d, (busy, xf, qw) in (("up", (L.X_UP_BUSY_US, L.X_UP_XFERS, L.X_UP_QWAIT_US)),
                                  ("down", (L.X_DOWN_BUSY_US, L.X_DOWN_XFERS,
                                            L.X_DOWN_QWAIT_US))):
            b = [float(r.X[t, busy]) for r in runs]
            out[f"link_{name}_{d}_busy_us"] = float(sum(b))
            out[f"link_{name}_{d}_utilisation"] = float(sum(
                bi / m if m > 0 else 0.0 for bi, m in zip(b, makespans_us)) / n)
            out[f"link_{name}_{d}_transfers"] = int(sum(r.X[t, xf] for r in runs))
            out[f"link_{name}_{d}_queue_us"] = float(sum(r.X[t, qw] for r in runs))
    waits = []
    for r in runs:
        slots = getattr(r, "slots", None)
        if slots is not None and slots.closed:  # folded (kvsim.replay.slots)
            ids, xf, qw = slots.link_columns()
        else:
            ids, xf, qw = np.arange(r.R_f.shape[0]), r.R_f[:, L.RF_XFERS], \
                r.R_f[:, L.RF_QWAIT_US]
        keep = xf > 0
        if measured is not None:
            keep &= np.isin(ids, measured)
        # a request's transfers (one per tier): its queueing delay spread evenly over them
        k = xf[keep]
        w = qw[keep] / k
        waits.append(np.repeat(w, k.astype(np.int64)))
    q = np.concatenate(waits) if waits else np.zeros(0)
    out["link_transfers_up"] = int(len(q))
    nan = float("nan")
    out["link_queue_p50_us"] = float(np.percentile(q, 50)) if len(q) else nan
    out["link_queue_p99_us"] = float(np.percentile(q, 99)) if len(q) else nan
    out["link_queue_mean_us"] = float(q.mean()) if len(q) else nan
    return out
