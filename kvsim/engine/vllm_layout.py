"""The layout of :mod:`kvsim.engine.vllm_step`'s array state: the column and slot numbers of
its engine config ``ip``, request table ``R``, scheduler scalars ``sv``, output counts ``oc``
and KV event rows ``oev`` (their meaning: vllm_step's module docstring).  Constants only, no
code; ``vllm_step`` star-imports them, so ``vllm_step.K_PLEN`` and the rest stay where
callers read them.
"""

from __future__ import annotations

# engine config (ip)
(P_BS, P_NGPU, P_MAXSEQ, P_MAXTOK, P_CHUNKED, P_THR, P_PRIO, P_CACHING, P_RESERVE,
 P_WMARK, P_MAXLEN, P_LOOK, P_SEED) = range(13)
NUM_PARAMS = 13
# request columns (R)
(K_PLEN, K_OLEN, K_PRIO, K_RANK, K_H0, K_H1, K_STATUS, K_NCOMP, K_NOUT, K_NPRE, K_NCACHED,
 K_SEQ, K_SCHED, K_NEWB, K_SPECK, K_ACCEPT, K_SPEC, K_SSPEC, K_EXT, K_ID) = range(20)
NUM_COLS = 20
# K_ID: the request's id, which seeds its drafts' acceptance (kvsim.engine.vllm_spec): its
# row in the Python handle, its request id in the closed loop, whose rows are the core's
# request-table rows (kvsim.engine.vllm_rows)
# status (the Python port's strings)
WAITING, RUNNING, PREEMPTED, FINISHED, UNSEEN = 0, 1, 2, 3, 4
# scheduler scalars (sv)
V_NRUN, V_WHEAD, V_WLEN, V_HLEN = range(4)
NUM_SV = 4
# output counts (oc)
(O_SCHED, O_BL, O_BLIDS, O_ADM, O_PRE, O_FIN, O_EV, O_RESET, O_FREE_SCHED,
 O_FREE) = range(10)
NUM_OC = 10
# KV event kinds (oev[:, 0])
E_STORED, E_REMOVED, E_CLEARED = 0, 1, 2
