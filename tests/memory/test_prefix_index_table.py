"""The HBM pool's prefix index (kvsim.memory.fast: ``hidx``, keys and first blocks
interleaved in one array, linear probing, backward-shift deletion, same-hash blocks in the
circular lists h_next/h_prev) against a Python dict of lists, brute force over random
operations on a small table where probe runs collide and wrap around; and the strided
keys/values views the closed loop's scheduler reads."""

import numpy as np

from kvsim.memory.fast import (
    PoolConfig,
    _home,
    _hslot,
    index_add,
    index_keys_values,
    index_remove,
    new_state,
)


def _state(num_blocks):
    return new_state(PoolConfig(num_blocks=num_blocks, block_size_tokens=16))


def test_interleaved_layout_exact():
    st = _state(8)  # entries: a power of two >= 2 x 8 -> 16
    hidx = st.hidx
    assert hidx.shape == (32,) and (hidx[0::2] == 0).all() and (hidx[1::2] == -1).all()
    h = 987654321
    index_add(st.block_hash, hidx, st.h_next, st.h_prev, 3, h)
    i = _home(h, 15)
    assert hidx[2 * i] == h and hidx[2 * i + 1] == 3  # key at 2i, its first block after it
    assert _hslot(hidx, h) == 2 * i
    index_add(st.block_hash, hidx, st.h_next, st.h_prev, 5, h)  # same hash: listed after 3
    assert hidx[2 * i + 1] == 3 and st.h_next[3] == 5 and st.h_next[5] == 3
    keys, vals = index_keys_values(hidx)
    assert keys[i] == h and vals[i] == 3 and keys.strides == (16,)
    assert index_remove(st.block_hash, hidx, st.h_next, st.h_prev, 3) == h
    assert hidx[2 * i + 1] == 5 and st.block_hash[3] == 0  # the next block is first now
    index_remove(st.block_hash, hidx, st.h_next, st.h_prev, 5)
    assert (hidx[0::2] == 0).all() and (hidx[1::2] == -1).all()


def test_matches_dict_under_collisions():
    rng = np.random.default_rng(0)
    n_blocks = 8  # 16 entries
    mask = 15
    by_home = {}
    for h in range(1, 200_000):
        by_home.setdefault(_home(h, mask), []).append(h)
    pool = by_home[15][:5] + by_home[0][:3] + by_home[6][:3]  # runs wrap past the end
    for _ in range(200):
        st = _state(n_blocks)
        ref = {}  # hash -> blocks in registration order
        owner = {}  # block -> hash
        for _ in range(40):
            free = [b for b in range(1, n_blocks) if b not in owner]
            if owner and (not free or rng.random() < 0.45):
                b = int(rng.choice(sorted(owner)))
                h = owner.pop(b)
                assert index_remove(st.block_hash, st.hidx, st.h_next, st.h_prev, b) == h
                ref[h].remove(b)
                if not ref[h]:
                    del ref[h]
            else:
                b = int(rng.choice(free))
                h = int(rng.choice(pool))
                index_add(st.block_hash, st.hidx, st.h_next, st.h_prev, b, h)
                owner[b] = h
                ref.setdefault(h, []).append(b)
            for k in pool:  # every key: first block and its list, or absent
                p = _hslot(st.hidx, k)
                if k in ref:
                    assert st.hidx[p] == k and st.hidx[p + 1] == ref[k][0]
                    chain, cur = [], ref[k][0]
                    while True:
                        chain.append(cur)
                        cur = int(st.h_next[cur])
                        if cur == ref[k][0]:
                            break
                    assert chain == ref[k]
                else:
                    assert st.hidx[p] == 0
            keys = np.flatnonzero(st.hidx[0::2])
            assert len(keys) == len(ref)
            for i in keys:  # every stored key reachable by probing from its home entry
                assert _hslot(st.hidx, st.hidx[2 * i]) == 2 * i
