"""Column layout of the replay core's state arrays (names -> indices) and their allocation.

The compiled core (:mod:`kvsim.replay.kernel.core`) keeps all its state in a handful of numpy arrays
so numba sees only arrays and scalars.  Each 2-D table has named columns; the constants
below are those names.  Module-level integer constants are compile-time constants for numba.

Invariants the core maintains (checked by :func:`kvsim.replay.kernel.core.check_invariants`):

- HBM slot 0 is the reserved null block (never allocated).  Every other slot is in exactly
  one state: EMPTY (on the empty stack), HELD (ref count >= 1) or CACHED (ref 0, hashed,
  a candidate of the HBM policy).
- A lower-tier slot is FREE (on its free stack) or RESIDENT (in its hash map, a candidate).
- Resident counts never exceed a tier's capacity (slots are exactly the capacity).
"""

from __future__ import annotations

import numpy as np

# --- per-request integer table R_i[request_id, ...] -----------------------------------------
RI_STATE = 0  # one of RS_* below
RI_PROMPT = 1  # prompt tokens (from ARRIVE)
RI_ARRIVE_US = 2  # engine time of the ARRIVE row
RI_BT_START = 3  # block records: offset in the arena
RI_BT_LEN = 4  # block records used (= blocks in the request's table)
RI_BT_CAP = 5  # block records reserved
RI_PREFILLED = 6  # prompt tokens computed so far (ACCESS rows in PREFILL)
RI_NOUT = 7  # output tokens produced (first token + decode steps)
RI_PRIO = 8  # request_priority 0..100
RI_TTFT_DL = 9  # absolute TTFT deadline (-1 none)
RI_SEQ = 10  # seq slot in the HBM pool (-1 none)
RI_LATMASK = 11  # bit t set: the tier-t access latency was already paid at this admission
RI_TPOT_MISS = 12  # decode tokens that missed their deadline
RI_TPOT_DL = 13  # decode tokens that had a deadline
RI_DC_MISS = 14  # decode-critical misses charged to this request
RI_PREEMPTS = 15  # times preempted
RI_BOUND = 16  # 1 if deadline-bound (TTFT or decode deadline, or DECODE_CRITICAL intent)
RI_LOOKUP_TOK = 17  # prompt tokens looked up at admission
RI_HIT_TOK = 18  # tokens hit in HBM; +1, +2, +3: tokens hit in DRAM, CXL, NVMe
RI_PHASE = 22  # 0 admission pending, 1 admitted (first ACCESS not yet), 2 accessed
RI_ADMIT_STEP = 23  # engine step of admission
RI_TTFT_MISS = 24  # 1 if the TTFT deadline was missed
RI_RECOMP_TOK = 25  # tokens recomputed: seen before but resident nowhere
RI_TENANT = 26
RI_FT_PENDING = 27  # 1 while the first token is being produced by the current step
RI_EV_SUFFERED = 28  # HBM blocks this request brought in that were later evicted
RI_EV_CAUSED = 29  # HBM blocks evicted to make room for this request's blocks
# --write-policy vllm_offload (kvsim.replay.kernel.offload; vLLM 0.33's OffloadingConnector)
RI_OFF_RANK = 30  # the request's rank in the CPU tier's LRU (0 = none yet)
RI_OFF_NEXT = 31  # next prompt block to offer for storing (next_stored_chunk_idx)
RI_OFF_PEND = 32  # 1 while its finish waits for the next step's re-rank
RI_OFF_LINK = 33  # next request in that wait list (+1; 0 = end)
NRI = 34

RS_UNSEEN = 0
RS_WAITING = 1  # arrived, not admitted
RS_RUNNING = 2
RS_PREEMPTED = 3
RS_DONE = 4

# --- per-request float table R_f[request_id, ...] -------------------------------------------
RF_FIRST_US = 0  # end of the step that produced the first token (-1 = not yet)
RF_LAST_US = 1  # end of the step that produced the latest token
RF_CREDIT_US = 2  # recompute time saved by hits, not yet credited to a step
RF_CREDIT_RATE = 3  # saved microseconds per prompt token (applied to PREFILL ACCESS rows)
RF_STALL_US = 4  # transfer stalls charged to this request
RF_PF_BUDGET_US = 5  # queueing time left to hide prefetch transfers behind
RF_ADMIT_US = 6  # engine time of admission
RF_QWAIT_US = 7  # --link-model queue: time its transfers waited behind others on a link
RF_XFERS = 8  # --link-model queue: its transfers (one batched DMA per tier per admission)
NRF = 9

# --- arena A_i[entry, ...]: one record per block of a request (its ALLOCATE row) ------------
AI_HASH = 0  # content hash if the block is full and hashed, else 0 (never shared)
AI_SIZE = 1  # bytes
AI_TOKENS = 2
AI_PHASE = 3
AI_PRIO = 4
AI_RPRIO = 5
AI_DEADLINE = 6
AI_SLACK = 7
AI_TDS = 8
AI_PIN = 9
AI_PFOK = 10
AI_SEEN = 11  # 1 if this content was allocated before in the trace (pre-pass)
AI_NEXT = 12  # next_use ordinal (offline policies), NEVER if none
AI_FULL_HASH = 13  # the ALLOCATE row's hash: the content once the block is full (a decode
#                    block is allocated partial; it is cached when the next block follows it)
AI_OFF_SEEN = 14  # --write-policy vllm_offload: 1 once offered to the CPU tier (seen_keys)
NAI = 15

# --- HBM side table H_i[block id, ...] (the pool itself lives in kvsim.memory.fast) ---------
HI_OWNER = 0  # request that allocated it
HI_BI = 1  # its block index in that request
HI_TOKENS = 2
HI_HITS = 3  # HiCache-style hit count (write_through thresholds)
NHI = 4

# --- lower-tier slots L_i[slot, ...] (same first three columns as H_i) ----------------------
LI_OWNER = 0
LI_BI = 1
LI_TOKENS = 2
LI_STATE = 3  # 0 free, 1 resident
NLI = 4

# --- lower-tier scalars Lm[...] -------------------------------------------------------------
LM_TIER = 0
LM_CAP = 1
LM_FREE_TOP = 2
LM_USED = 3
NLM = 4

# --- counters C[...] (float64) --------------------------------------------------------------
C_CLOCK_US = 0  # end of the last finished step
C_STEP = 1  # current step index (-1 before the first STEP row)
C_STEP_START_US = 2
C_STEP_DUR_US = 3
C_STEP_SAVED_US = 4
C_STEP_STALL_US = 5
C_STEP_EXTRA_US = 6  # swap and preemption-recompute time of the current step
C_NSTEP_BUF = 7  # rows in the step buffer
C_NPEND = 8  # pending ACCESS rows of the current step
C_NLOG = 9  # rows in the decision-log buffer
C_LOG_SEQ = 10
C_PEND_ADMIT = 11  # request whose admission ALLOCATE rows are being gathered (-1 none)
C_NRUN = 12  # requests in the running list
C_WARM_DONE = 13  # 1 once the warm-up snapshot was taken
C_WARM_US = 14  # engine time of the first measured step
C_OFF_RANK = 15  # --write-policy vllm_offload: the CPU tier LRU's rank counter (_next_rank)
C_OFF_HEAD = 16  # ... first request (+1) whose finish waits for the next step's re-rank
C_OFF_TAIL = 17  # ... last one (+1)
C_ALLOC_ORD = 18  # ALLOCATE rows seen (ordinal for next_use)
C_ARENA_TOP = 19
C_USED = 20  # occupancy now: +0 HBM blocks held by requests (cached ones are reclaimable,
#              not counted), +1..+3 resident blocks of DRAM, CXL, NVMe (= that tier's
#              Lm[LM_USED], copied by tier_ops.spill_step, the only code that changes it)
C_HBM_USED = C_USED
C_PEAK = 24  # +0: peak HBM blocks held; +1..+3: peak resident blocks of DRAM, CXL, NVMe
C_MAX_BT = 28  # largest block table seen (log buffer sizing)
C_IN_STEP = 29  # 1 once a STEP row was seen
C_ARENA_NEED = 30  # record rows the core asked for with ST_NEED_ARENA
# metrics (accumulated; the warm-up snapshot is subtracted)
M_FIRST = 32
M_LOOKUP_TOK = 32
M_HIT_TOK = 33  # +0 HBM, +1 DRAM, +2 CXL, +3 NVMe
M_LOOKUP_BLK = 37
M_HIT_BLK = 38  # +0..+3
M_RECOMP_TOK = 42  # tokens of blocks seen before but resident in no tier (recomputed)
M_PREEMPT_RECOMP_TOK = 43
M_EVICT = 44  # +0..+3 blocks dropped from each tier
M_DEMOTE = 48  # +0..+3 blocks spilled from each tier to a lower one
M_PROMOTE = 52  # blocks fetched on demand
M_PREFETCH = 53  # blocks fetched with queueing time to hide behind
M_PREFETCH_USEFUL = 54  # ... fully hidden
M_PREFETCH_WASTED = 55  # ... loaded but never used (0 in this model, see docs/simulate.md)
M_BYTES_UP = 56  # +0..+3 bytes moved up over each tier's link (index 0 unused)
M_BYTES_DOWN = 60  # +0..+3 bytes moved down over each tier's link
M_WRITE_THROUGH = 64
M_PREEMPTIONS = 65
M_SWAP_OUT_BYTES = 66
M_SWAP_IN_BYTES = 67
M_DC_MISS = 68
M_OVERFLOW = 69
M_STALL_US = 70
M_SAVED_US = 71
M_COW_COPIES = 72
M_ALLOC_BLK = 73
M_FIRST_TOK = 74  # tokens of shareable blocks computed for the first time in the trace
M_LAST = 75
NC = 80

# --- config K[...] (int64) ------------------------------------------------------------------
K_WRITE_POLICY = 0  # WP_*
K_PREEMPT_SWAP = 1  # 1 = swap, 0 = recompute
K_PRIO_SCHED = 2  # 1 = preempt lowest request_priority, 0 = last admitted
K_LOG = 3  # 1 = record decisions
K_PREFETCH = 4  # 1 = hide promotions behind queueing time
K_BLOCK_TOKENS = 5
K_OFFLINE = 6  # 1 = fill next_use (offline policies)
K_WARMUP_STEP = 7  # metrics snapshot when this step starts (-1 = none)
K_LOG_LIFECYCLE = 8  # 1 = also record ALLOCATE/HIT/RELEASE/REVIVE/FREE rows
K_LINK_QUEUE = 9  # 1 = transfers queue on their links (kvsim.replay.kernel.links)
K_LOWER_LRU = 10  # bit t set: lower tier t runs the built-in lru (kvsim.replay.kernel.spill)
NK = 11

WP_WRITE_BACK = 0
WP_WRITE_THROUGH = 1
WP_WRITE_THROUGH_SELECTIVE = 2
WP_VLLM_OFFLOAD = 3  # vLLM's native CPU offloading (kvsim.replay.kernel.offload)

# --- cost X[tier, ...] (float64) ------------------------------------------------------------
X_UP_LAT_US = 0  # latency of a read from the tier into HBM (medium + link)
X_UP_BYTES_PER_US = 1  # min(medium read bandwidth, link bandwidth)
X_DOWN_LAT_US = 2
X_DOWN_BYTES_PER_US = 3  # min(medium write bandwidth, link bandwidth)
# the links' state under --link-model queue (kvsim.replay.kernel.links), per direction:
# when the link's FIFO queue drains, busy time, queueing delay and transfers so far
X_UP_FREE_US = 4
X_UP_BUSY_US = 5
X_UP_QWAIT_US = 6
X_UP_XFERS = 7
X_DOWN_FREE_US = 8
X_DOWN_BUSY_US = 9
X_DOWN_QWAIT_US = 10
X_DOWN_XFERS = 11
NX = 12

# --- decision-log buffer --------------------------------------------------------------------
GI_STEP = 0
GI_ACTION = 1
GI_HASH = 2
GI_REQ = 3
GI_BI = 4
GI_FROM = 5
GI_TO = 6
GI_BYTES = 7
GI_REASON = 8  # policy reason code (-1: the replay's own reason, see GI_WHY)
GI_WHY = 9  # index into kvsim.replay.kernel.core.WHY (the replay's sentences), -1 = policy's
GI_DC = 10
GI_NCAND = 11
GI_SEQ = 12
NGI = 13
GF_TIME = 0
GF_COST = 1
NGF = 2
# candidate snapshot
CI_HASH = 0
CI_REQ = 1
CI_BI = 2
CI_COUNT = 3
CI_PRIO = 4
CI_RPRIO = 5
CI_DEADLINE = 6
CI_SLACK = 7
CI_NEXT = 8
CI_PHASE = 9
CI_PINNED = 10
NCI = 11
CF_SCORE = 0
CF_LAST = 1
CF_RECOMP = 2
NCF = 3

# --- step buffer S[row, ...] ----------------------------------------------------------------
S_STEP = 0
S_START_US = 1
S_LATENCY_US = 2
S_STALL_US = 3
S_SAVED_US = 4
S_DURATION_US = 5
S_EXTRA_US = 6
# occupancy when the step closes (blocks): +0 HBM held by requests, +1..+3 resident in
# DRAM, CXL, NVMe; S_HBM_CACHED: HBM cached candidates (ref 0, hashed), -1 when the core
# does not pass the pool's scalars to _finalize_step (see kvsim.replay.kernel.bookkeeping)
S_USED = 7
S_HBM_CACHED = 11
NS = 12

TIER_NAMES = ("hbm", "dram", "cxl", "nvme")


def new_request_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Request tables for ids 0..n-1, every request UNSEEN."""
    ri = np.zeros((n, NRI), dtype=np.int64)
    ri[:, RI_SEQ] = -1
    ri[:, RI_TTFT_DL] = -1
    rf = np.zeros((n, NRF), dtype=np.float64)
    rf[:, RF_FIRST_US] = -1.0
    rf[:, RF_LAST_US] = -1.0
    return ri, rf


def grow_rows(a: np.ndarray, n: int, fill=0) -> np.ndarray:
    """``a`` with at least ``n`` rows (doubling), new rows set to ``fill``."""
    if a.shape[0] >= n:
        return a
    new = max(n, 2 * a.shape[0], 16)
    out = np.empty((new,) + a.shape[1:], dtype=a.dtype)
    out[: a.shape[0]] = a
    out[a.shape[0]:] = fill
    return out
