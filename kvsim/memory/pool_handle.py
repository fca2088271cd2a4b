"""The Python handle of the compiled HBM pool: :class:`FastPool` wraps the njit functions of
:mod:`kvsim.memory.fast` (state, lookup, fork, checks) and :mod:`kvsim.memory.pool_ops`
(operations that ask the order policy) behind methods, for tests, the throughput
benchmark and notebooks.  The replay core calls the njit functions directly."""

from __future__ import annotations

import numpy as np

from kvsim.jit.uncounted_call import call_uncounted
from kvsim.memory import fifo_order
from kvsim.memory.fast import (
    COUNTER_NAMES,
    INVARIANTS,
    PREEMPT_RECOMPUTE,
    S_N_CAND,
    S_N_EMPTY,
    AllocResult,
    PoolConfig,
    new_out,
    new_state,
    pool_check,
    pool_fork,
    pool_lookup,
    seq_close,
    seq_open,
)
from kvsim.memory.pool_ref import pool_ref
from kvsim.policy.api import new_block_view


class FastPool:
    """A compiled pool plus its order policy; Python methods wrap the njit functions.

    ``order`` is a module following :mod:`kvsim.policy.api` (``init``, ``on_insert``,
    ``on_hit``, ``on_remove``, ``victim`` as njit functions), or None for
    :mod:`kvsim.memory.fifo_order` (vLLM's exact order).  ``self.ops`` is
    :mod:`kvsim.memory.pool_ops` (compiled once for every order); ``self.st`` the pool's
    arrays (:class:`kvsim.memory.fast.PoolState`), ``self.st_c`` the same arrays as the
    value the compiled functions take (:class:`kvsim.memory.pool_ref.PoolRef`);
    ``self.pst`` the order as the value those functions take, ``self.pol = (self.pst,
    hooks)`` (:mod:`kvsim.policy.hooks`).
    """

    def __init__(self, config: PoolConfig, order=None, params: dict | None = None):
        from kvsim.memory import pool_ops
        from kvsim.policy.hooks import policy_value, view_ref

        self.config = config
        self.order = order if order is not None else fifo_order
        self.ops = pool_ops
        self.st = new_state(config)
        self.st_c = pool_ref(self.st)  # what the compiled functions take (same arrays)
        self.view = new_block_view(config.num_blocks)
        self.pst = self.order.init(config.num_blocks - 1, config.num_blocks, params or {})
        self.pol = policy_value(self.order, self.pst, True)
        self.view_c = view_ref(self.view)  # what pool_ops takes (same arrays as self.view)
        self.out = new_out(config)

    def _op(self, op, *args):
        """``op(st, pol, view, *args)`` of :mod:`kvsim.memory.pool_ops` (compiled without
        reference counting), leaving this pool's structrefs as it found them
        (:func:`kvsim.jit.uncounted_call.call_uncounted`)."""
        return call_uncounted(op, self.st_c, self.pol, self.view_c, *args)

    # -- seqs ---------------------------------------------------------------------------
    def open_seq(self, tenant: int = 0) -> int:
        if not 0 <= tenant < self.config.max_tenants:
            raise ValueError(f"tenant must be in 0..{self.config.max_tenants - 1}, "
                             f"got {tenant}")
        seq = int(call_uncounted(seq_open, self.st_c, tenant))
        if seq < 0:
            raise RuntimeError("no free seq slot (raise PoolConfig.max_seqs)")
        return seq

    def close_seq(self, seq: int) -> None:
        call_uncounted(seq_close, self.st_c, seq)

    # -- operations ---------------------------------------------------------------------
    def lookup(self, hashes, num_tokens: int) -> list[int]:
        h = np.asarray(hashes, dtype=np.int64)
        k = call_uncounted(pool_lookup, self.st_c, h, len(h), num_tokens, self.out.blocks)
        return [int(x) for x in self.out.blocks[:k]]

    def allocate(self, seq: int, hashes, num_tokens: int = 0,
                 now_us: float = 0.0) -> AllocResult | None:
        """Append ``len(hashes)`` blocks (0 = unhashed/partial); None if it does not fit."""
        h = np.asarray(hashes, dtype=np.int64)
        n = len(h)
        k = self._checked(self._op(self.ops.allocate, seq, h, n, num_tokens,
                                   float(now_us), self.out))
        if k < 0:
            return None
        o = self.out
        for i in range(k, n):  # the core writes a new block's view before admit()
            b = int(o.blocks[i])
            if h[i] != 0:
                self.view.content_hash[b] = h[i]
                self.view.insert_us[b] = now_us
                self.view.last_access_us[b] = now_us
                self.view.access_count[b] = 1
        self._checked(self._op(self.ops.admit, o, k, n, float(now_us)))
        return AllocResult(int(k), [int(x) for x in o.blocks[:n]],
                           [int(x) for x in o.kind[:n]], [int(x) for x in o.evicted_hash[:n]])

    def cache_block(self, seq: int, index: int, h: int, now_us: float = 0.0) -> None:
        self._checked(self._op(self.ops.cache_block, seq, index, int(h), float(now_us)))

    def cache_blocks(self, seq: int, first: int, hashes, now_us: float = 0.0) -> None:
        """:meth:`cache_block` for blocks ``first ..`` of ``seq`` (one compiled call)."""
        h = np.asarray(hashes, dtype=np.int64)
        self._checked(self._op(self.ops.cache_blocks, seq, first, h, float(now_us)))

    def fork(self, parent: int, child: int) -> None:
        self._checked(call_uncounted(pool_fork, self.st_c, parent, child))

    def write_last(self, seq: int, now_us: float = 0.0) -> int:
        return int(self._checked(self._op(self.ops.write_last, seq, float(now_us),
                                          self.out)))

    def free(self, seq: int, now_us: float = 0.0) -> None:
        self._checked(self._op(self.ops.free, seq, float(now_us)))

    def free_tail(self, seq: int, n: int, now_us: float = 0.0) -> None:
        self._checked(self._op(self.ops.free_tail, seq, n, float(now_us)))

    def preempt(self, seq: int, mode: int = PREEMPT_RECOMPUTE, now_us: float = 0.0) -> int:
        return int(self._checked(self._op(self.ops.preempt, seq, mode, float(now_us))))

    def clear_cache(self, now_us: float = 0.0) -> bool:
        """vLLM reset_prefix_cache: drop every hash when no block is held (else False)."""
        return bool(self._checked(self._op(self.ops.clear_cache, float(now_us), self.out)))

    # -- inspection ---------------------------------------------------------------------
    def table(self, seq: int) -> list[int]:
        return [int(x) for x in self.st.tables[seq, :self.st.seq_len[seq]]]

    def ref_cnt(self, b: int) -> int:
        return int(self.st.ref_cnt[b])

    def block_hash(self, b: int) -> int:
        return int(self.st.block_hash[b])

    def num_free_blocks(self) -> int:
        """Empty + cached blocks (vLLM get_num_free_blocks)."""
        return int(self.st.sc[S_N_EMPTY] + self.st.sc[S_N_CAND])

    def empties(self) -> list[int]:
        n = self.config.num_blocks
        out, cur = [], int(self.st.e_next[n])
        while cur != n:
            out.append(cur)
            cur = int(self.st.e_next[cur])
        return out

    def free_queue(self) -> list[int]:
        """vLLM's free queue: empties, then candidates in eviction order (needs an order
        module with an ``order(state)`` function, as fifo_order has)."""
        if not hasattr(self.order, "order"):
            raise TypeError(f"order policy {self.order.NAME!r} cannot list its order")
        return self.empties() + [int(b) for b in self.order.order(self.pst)]

    def counters(self) -> dict[str, int]:
        return {name: int(self.st.counters[i]) for i, name in enumerate(COUNTER_NAMES)}

    def check_invariants(self) -> None:
        code = int(pool_check(self.st_c))
        if code:
            raise AssertionError(f"invariant {code} broken: {INVARIANTS[code]}")

    def _checked(self, value):
        """``value``, after :meth:`check_invariants` when ``config.debug`` (after every
        operation that changes the pool; the compiled operations do not check)."""
        if self.config.debug:
            self.check_invariants()
        return value
