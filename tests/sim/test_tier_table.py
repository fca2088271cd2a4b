"""The lower tiers' hash table (kvsim.replay.kernel.tiers: keys and values interleaved in one array,
linear probing, backward-shift deletion) against a Python dict, brute force over random
operations on a small table where probe runs collide and wrap around; and the values of
the table the three tiers share (``slot * 4 + tier``)."""

from types import SimpleNamespace

import numpy as np

from kvsim.replay.kernel.tiers import (
    _FIB,
    hash_del,
    hash_put,
    hash_slot,
    lower_find,
    tier_find,
    tier_value,
)


def _home(h, entries):
    """Home entry of key ``h`` (int64 arithmetic wrapping, as compiled)."""
    x = (h * _FIB) & (2**64 - 1)
    if x >= 2**63:
        x -= 2**64
    return (x >> 32) & (entries - 1)


def _table(entries):
    t = np.zeros(2 * entries, dtype=np.int64)
    t[1::2] = -1
    return t


def test_interleaved_layout_exact():
    t = _table(8)
    h = 12345
    hash_put(t, h, 7)
    i = _home(h, 8)
    assert t[2 * i] == h and t[2 * i + 1] == 7  # key at 2i, its slot right after it
    assert hash_slot(t, h) == 2 * i
    assert np.count_nonzero(t[0::2]) == 1 and np.count_nonzero(t[1::2] != -1) == 1
    hash_del(t, h)
    assert (t[0::2] == 0).all() and (t[1::2] == -1).all()


def test_matches_dict_under_collisions():
    rng = np.random.default_rng(0)
    entries = 16
    # keys grouped on 3 home positions (one next to the end, so runs wrap around)
    by_home = {}
    for h in range(1, 200_000):
        by_home.setdefault(_home(h, entries), []).append(h)
    pool = by_home[15][:6] + by_home[0][:3] + by_home[7][:4]
    for _ in range(300):
        t, ref = _table(entries), {}
        for _ in range(40):
            h = int(rng.choice(pool))
            if h in ref and rng.random() < 0.5:
                hash_del(t, h)
                del ref[h]
            elif h not in ref and len(ref) < entries // 2:
                v = int(rng.integers(0, 1000))
                hash_put(t, h, v)
                ref[h] = v
            for k in pool:  # every key: found with its slot, or absent
                p = hash_slot(t, k)
                if k in ref:
                    assert t[p] == k and t[p + 1] == ref[k]
                else:
                    assert t[p] == 0
            assert np.count_nonzero(t[0::2]) == len(ref)
            assert (t[1::2][t[0::2] == 0] == -1).all()


def test_shared_table_names_tier_and_slot():
    """One table for DRAM, CXL and NVMe: a key's value names its tier and slot; each tier
    finds only its own keys; a key moved to another tier is rewritten in place."""
    t = _table(16)
    hash_put(t, 11, tier_value(5, 1))
    hash_put(t, 22, tier_value(0, 3))
    tiers = {k: SimpleNamespace(L_h=t, Lm=np.array([k, 4, 0, 0], dtype=np.int64))
             for k in (1, 2, 3)}
    assert lower_find(t, 11) == 21 and lower_find(t, 22) == 3 and lower_find(t, 33) == -1
    assert [tier_find.py_func(tiers[k], 11) for k in (1, 2, 3)] == [5, -1, -1]
    assert [tier_find.py_func(tiers[k], 22) for k in (1, 2, 3)] == [-1, -1, 0]
    pos = hash_slot(t, 11)
    hash_put(t, 11, tier_value(7, 2))  # demoted DRAM slot 5 -> CXL slot 7
    assert hash_slot(t, 11) == pos and np.count_nonzero(t[0::2]) == 2
    assert [tier_find.py_func(tiers[k], 11) for k in (1, 2, 3)] == [-1, 7, -1]
