"""The compiled vLLM step function (:mod:`kvsim.engine.vllm_step`) behind the interface of
the plain-Python port (:class:`kvsim.engine.vllm_scheduler.VllmScheduler`): the same
:class:`~kvsim.engine.vllm_scheduler.StepResult` per step, so the two are compared field
by field (tests/engine/test_vllm_step.py) and ``kvsim validate --sched-recording`` runs
either (``engine="compiled"``, the default, or ``"python"``).

The requests are known up front (their hashes are one array); :meth:`add_request` makes
one of them arrive.
"""

from __future__ import annotations

import numpy as np

from kvsim.engine import vllm_step as V
from kvsim.engine.vllm_pool import vllm_pool
from kvsim.engine.vllm_rows import new_outputs
from kvsim.engine.vllm_scheduler import EngineConfig, SimRequest, StepResult, chain_hashes
from kvsim.engine.vllm_spec import acceptance_units

__all__ = ["CompiledVllmScheduler"]

#: no lower tiers: an empty 2-entry hash table (kvsim.engine.vllm_step.lookup_ext)
_NO_TIERS = np.zeros(2, np.int64)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class CompiledVllmScheduler:
    """vLLM 0.33's v1 scheduler over the replay's compiled pool, compiled.

    ``requests``: every request the run will see (``SimRequest``; ``idx`` = position).
    """

    def __init__(self, config: EngineConfig, requests: list[SimRequest]):
        from kvsim.jit.disk_cache import seal_all
        from kvsim.memory import fifo_order
        from kvsim.memory.fast import PoolConfig, new_out, new_state
        from kvsim.memory.pool_ref import pool_ref
        from kvsim.policy.api import new_block_view
        from kvsim.policy.hooks import policy_value, view_ref

        if config.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be fcfs or priority, got {config.policy!r}")
        seal_all()
        self.cfg = config
        bs = config.block_size
        N = len(requests)
        for k, r in enumerate(requests):
            if r.idx != k:
                raise ValueError(f"request {k} has idx {r.idx}: expected positions")
            if not r.hashes:
                r.hashes = chain_hashes(r.all_tokens[:r.prompt_len + r.output_len - 1], bs,
                                        r.cache_salt)
        self.requests = requests
        ip = np.zeros(V.NUM_PARAMS, np.int64)
        ip[V.P_BS], ip[V.P_NGPU] = bs, config.num_gpu_blocks
        ip[V.P_MAXSEQ], ip[V.P_MAXTOK] = config.max_num_seqs, config.max_num_batched_tokens
        ip[V.P_CHUNKED] = int(config.enable_chunked_prefill)
        ip[V.P_THR] = config.long_prefill_token_threshold
        ip[V.P_PRIO] = int(config.policy == "priority")
        ip[V.P_CACHING] = int(config.enable_prefix_caching)
        ip[V.P_RESERVE] = int(config.scheduler_reserve_full_isl)
        ip[V.P_WMARK] = int(config.watermark * config.num_gpu_blocks)
        ip[V.P_MAXLEN] = min(config.max_model_len, 1 << 62)
        ip[V.P_LOOK] = int(config.spec_lookahead)
        ip[V.P_SEED] = config.spec_seed
        self.ip = ip
        R = np.zeros((max(N, 1), V.NUM_COLS), np.int64)
        lens = [len(r.hashes) for r in requests]
        h_off = np.zeros(N + 1, np.int64)
        h_off[1:] = np.cumsum(lens) if N else []
        self.hh = np.array([h for r in requests for h in r.hashes] or [0], np.int64)
        ranks = sorted(range(N), key=lambda k: (requests[k].request_id, k))
        for k, r in enumerate(requests):
            R[k, V.K_PLEN], R[k, V.K_OLEN], R[k, V.K_PRIO] = r.prompt_len, r.output_len, r.priority
            R[k, V.K_H0], R[k, V.K_H1] = h_off[k], h_off[k + 1]
        if N:
            R[np.array(ranks), V.K_RANK] = np.arange(N)
        R[:, V.K_SPECK] = config.num_speculative_tokens
        R[:, V.K_ACCEPT] = acceptance_units(config.spec_acceptance_rate)
        R[:, V.K_STATUS] = V.UNSEEN
        R[:, V.K_NCACHED] = -1
        R[:, V.K_SEQ] = -1
        R[:, V.K_ID] = np.arange(R.shape[0])
        self.R = R
        self.arr = np.array([r.arrival_time for r in requests] or [0.0], np.float64)
        self.sv = np.zeros(V.NUM_SV, np.int64)
        self.run = np.zeros(max(N, 1), np.int64)
        self.wq = np.zeros(max(N, 1), np.int64)
        self.heap = np.zeros(max(N, 1), np.int64)
        extra = 2 * config.num_speculative_tokens  # drafts and their lookahead slots
        per_seq = max([_cdiv(r.prompt_len + r.output_len + extra, bs) for r in requests]
                      or [1]) + 2
        pc = PoolConfig(num_blocks=config.num_gpu_blocks, block_size_tokens=bs,
                        enable_caching=config.enable_prefix_caching,
                        max_seqs=config.max_num_seqs + 2, max_blocks_per_seq=per_seq)
        self._pst_arrays = new_state(pc)
        fifo_order.use_inline(self._pst_arrays)  # vLLM's order as the pool's inline lists
        self.st = pool_ref(self._pst_arrays)
        self._view_arrays = new_block_view(pc.num_blocks)
        self.view = view_ref(self._view_arrays)
        self._order_state = fifo_order.init(pc.num_blocks - 1, pc.num_blocks, {})
        self.pol = policy_value(fifo_order, self._order_state, True)
        self.pout = new_out(pc, 0)
        self.pl = vllm_pool(self.st, self.pol, self.view, self.pout)
        self.hits = np.zeros(per_seq, np.int64)
        self.hs = np.zeros(per_seq, np.int64)
        (self.osched, self.obl, self.oblids, self.oadm, self.opre, self.ofin, self.oev,
         self.ores, self.oc) = new_outputs(N, config.num_gpu_blocks, config.max_num_seqs,
                                        per_seq)
        self._compiled = False  # V.step compiled or loaded for these types (step_raw)

    # -- the interface of VllmScheduler -----------------------------------------------------
    def add_request(self, r: SimRequest | int) -> None:
        i = r if isinstance(r, int) else r.idx
        V.add_request(self.ip, self.R, self.arr, self.sv, self.wq, self.heap, i)

    def has_requests(self) -> bool:
        return bool(self.sv[V.V_NRUN] > 0 or V.num_waiting(self.ip, self.sv) > 0)

    def num_free_blocks(self) -> int:
        return int(self._pst_arrays.sc[0] + self._pst_arrays.sc[1])

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        ok = V.reset_prefix_cache(self.ip, self.R, self.arr, self.sv, self.run, self.wq,
                                  self.heap, bool(reset_running_requests), self.pl, self.opre,
                                  self.oev, self.ores, self.oc)
        return bool(ok)

    def step_raw(self) -> int:
        """One step, outputs left in the buffers (``oc`` counts); the caller zeroes
        ``oc`` when it has read them."""
        args = (self.ip, self.R, self.arr, self.hh, self.sv, self.run, self.wq, self.heap,
                self.pl, self.hits, self.hs, self.osched, self.obl, self.oblids, self.oadm,
                self.opre, self.ofin, self.oev, self.oc, _NO_TIERS)
        if not self._compiled:  # by one process at a time (another compiling: wait, load)
            from kvsim.jit.disk_cache import compile_for

            compile_for(V.step, args)
            self._compiled = True
        return int(V.step(*args))

    def step(self) -> StepResult:
        self.step_raw()
        res = self._result()
        self.oc[:] = 0
        return res

    def _result(self) -> StepResult:
        oc = self.oc
        res = StepResult()
        res.sched = [(int(a), int(b)) for a, b in self.osched[:oc[V.O_SCHED]]]
        m = 0
        for i, n in self.obl[:oc[V.O_BL]]:
            res.blocks.append((int(i), [int(x) for x in self.oblids[m:m + n]]))
            m += int(n)
        for i, h, resumed in self.oadm[:oc[V.O_ADM]]:
            (res.resumed if resumed else res.new).append((int(i), int(h)))
        res.preempted = [int(x) for x in self.opre[:oc[V.O_PRE], 0]]
        res.finished = [int(x) for x in self.ofin[:oc[V.O_FIN]]]
        res.free_sched = int(oc[V.O_FREE_SCHED])
        res.free_blocks = int(oc[V.O_FREE])
        for kind, a, b, c in self.oev[:oc[V.O_EV]]:
            if kind == V.E_STORED:
                hs = self.requests[a].hashes
                parent = hs[b - 1] if b else None
                res.events.append(("S", parent, tuple(hs[b:b + c]), int(a), int(b)))
            elif kind == V.E_REMOVED:
                res.events.append(("R", int(a)))
            else:
                res.events.append(("C",))
        res.reset_ok = [bool(x) for x in self.ores[:oc[V.O_RESET]]]
        return res

    # -- inspection ------------------------------------------------------------------------
    def num_preemptions(self) -> int:
        return int(self.R[:, V.K_NPRE].sum())
