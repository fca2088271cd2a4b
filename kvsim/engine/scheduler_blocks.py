"""Block accounting of the compiled scheduler (:mod:`kvsim.engine.scheduler`): the held-block
refcount table, prompt block hashes, the admission walk and the closed loop's cached-prefix
lookup.  Split from the step loop only to keep modules short; compiled and cached by numba
like it."""

from __future__ import annotations

import numpy as np

from kvsim.ingest.hashing import chain_hash, mix64, partial_hash
from kvsim.jit.decorators import njit
from kvsim.replay.kernel.tiers import hash_slot

# Every function here is called from compiled code (no C wrapper built); those only
# kvsim.engine.scheduler calls have no CPython wrapper either (``_prompt_hashes`` and
# ``_cached_prefix`` are called from Python too).  Wrappers are compiled code as well:
# docs/benchmarks.md, "Cold compile".

# state indices of the scheduler (kvsim.engine.scheduler.S_HELD / S_HEADC; asserted there)
S_HELD, S_HEADC = 7, 13


# ---- the held-block refcount table: content hash -> number of running sequences holding
# the block.  Open addressing, linear probing, key 0 = empty (hashes are never 0), deletion
# by backward shift, capacity a power of two >= 2 x keys: the scheme of kvsim.replay.kernel.tiers and
# the prefix index of kvsim.memory.fast (cheap to compile, unlike a typed Dict).  Written
# here rather than imported so numba's on-disk cache of this module never goes stale
# behind another module's edit.

@njit(cache=True, inline="always")
def _rslot(rk, h):
    """Position of key ``h`` in ``rk``, or of the empty position where it would go."""
    mask = rk.shape[0] - 1
    i = (h ^ (h >> 17) ^ (h >> 31) ^ (h >> 47)) & mask
    while True:
        k = rk[i]
        if k == h or k == 0:
            return i
        i = (i + 1) & mask


@njit(cache=True)
def _rdel(rk, rv, i):
    """Empty position ``i``, shifting later entries of its probe run back."""
    mask = rk.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        k = rk[j]
        if k == 0:
            break
        home = (k ^ (k >> 17) ^ (k >> 31) ^ (k >> 47)) & mask
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            rk[i] = k
            rv[i] = rv[j]
            i = j
    rk[i] = 0
    rv[i] = 0


@njit(cache=True)
def _prompt_hashes(c, nb, B, T, prompt, hashed, off, ids, root, hb):
    """``hb[:nb]`` = the content hashes of table request ``c``'s first ``nb`` prompt blocks
    (the hashes its admission ``ALLOCATE`` rows carry; 0 once the chain breaks)."""
    h = root
    for b in range(nb):
        e = min((b + 1) * B, prompt[c])
        # hash by the block's full content when the trace knows it (synthetic sessions
        # know their outputs), else by the prompt part (Mooncake's identified partial
        # block: with its token count, kvsim.ingest.hashing.partial_hash, so it never
        # matches a full block with the same id); unidentified blocks break the chain
        he = (b + 1) * B if (b + 1) * B <= hashed[c] else e
        if h != 0 and he <= hashed[c]:
            h = chain_hash(h, ids[off[c]:off[c + 1]], (b * B) // T, (he - 1) // T,
                           (b * B) % T)
            hb[b] = h if he == (b + 1) * B else partial_hash(h, he - b * B)
        else:
            h = 0
            hb[b] = 0


@njit(cache=True)
def _walk(hb, nb, prompt_c, B, rk):
    """``(shared, keyed)`` for a prompt of ``prompt_c`` tokens whose block hashes are
    ``hb[:nb]``: ``shared`` leading blocks are already held by running sequences (the
    replay's lookup: full hashed blocks, first miss stops it, at most ``(prompt - 1) // B``
    blocks); blocks ``shared .. keyed-1`` are full, hashed and not held (they become
    keys); the rest (partial, unhashed, or a duplicate past the lookup limit) are
    per-sequence blocks."""
    limit = (prompt_c - 1) // B
    s = 0
    while s < nb and s < limit and (s + 1) * B <= prompt_c and hb[s] != 0:
        if rk[_rslot(rk, hb[s])] != hb[s]:
            break
        s += 1
    k = s
    while k < nb and (k + 1) * B <= prompt_c and hb[k] != 0:
        if rk[_rslot(rk, hb[k])] == hb[k]:
            break
        k += 1
    return s, k


@njit(cache=True)
def _acquire(hb, s, k, rk, rv):
    """Reference keys ``hb[:k]`` (the first ``s`` already present)."""
    for b in range(k):
        i = _rslot(rk, hb[b])
        if b >= s and rk[i] != hb[b]:
            rk[i] = hb[b]
            rv[i] = 0
        rv[i] += 1


@njit(cache=True)
def _release(c, q, nkey, priv, B, T, prompt, hashed, off, ids, root, hb2, rk, rv, st):
    """Drop sequence ``c``'s blocks from the held count (``q`` owns its prompt).
    Idempotent: a released sequence holds nothing."""
    k = nkey[c]
    freed = priv[c]
    if k > 0:
        _prompt_hashes(q, k, B, T, prompt, hashed, off, ids, root, hb2)
        for b in range(k):
            i = _rslot(rk, hb2[b])
            rv[i] -= 1
            if rv[i] == 0:
                _rdel(rk, rv, i)
                freed += 1
    st[S_HELD] -= freed
    nkey[c] = 0
    priv[c] = 0


@njit(cache=True)
def _load_head(c, st, B, T, prompt, hashed, off, ids, root, hb):
    """Prompt blocks of waiting request ``c``, its hashes cached in ``hb``."""
    nb = (prompt[c] + B - 1) // B
    if st[S_HEADC] != c:
        _prompt_hashes(c, nb, B, T, prompt, hashed, off, ids, root, hb)
        st[S_HEADC] = c
    return nb


@njit(cache=True, inline="always")
def _decode_blocks(c, q, B, prompt, gen, nblk, spk):
    """New blocks sequence ``c``'s next decode step allocates (draft positions included)."""
    L = prompt[q] + gen[c] - 1
    return max(0, (L + spk[q]) // B + 1 - nblk[c])


@njit(cache=True, inline="always")
def _uniform(seed, slot, gen, j):
    z = mix64(np.uint64(seed) ^ mix64(np.uint64(slot) ^ mix64(np.uint64(gen * 64 + j))))
    return float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def _token_deadline(arr, ttft, tpot, first_us, g):
    """Absolute deadline of output token g (1-based): TTFT deadline + (g-1) TPOT, or the
    actual first-token time + (g-1) TPOT when only TPOT is set; -1 when none."""
    if tpot > 0:
        if ttft > 0:
            return arr + ttft + (g - 1) * tpot
        return first_us + (g - 1) * tpot
    if ttft > 0 and g <= 1:
        return arr + ttft
    return -1


@njit(cache=True)
def _cached_prefix(hb, nb, prompt_c, B, rk, phk, phv, tk):
    """Closed loop: leading prompt blocks whose KV is cached somewhere, as the replay
    will find them when it places the request (kvsim.replay.kernel.core ``_place``): the chain in
    HBM (the pool's prefix index ``phk``/``phv``, as :func:`kvsim.memory.fast.pool_lookup`,
    plus blocks admitted earlier in this step, ``rk``), then continued in DRAM, CXL, NVMe
    (the lower tiers' shared hash table ``tk``, keys and values interleaved:
    :func:`kvsim.replay.kernel.tiers.hash_slot` returns a key's position; a content is in at most
    one lower tier).  At most
    ``(prompt - 1) // B`` blocks: the last token is always computed (vLLM)."""
    limit = min(nb, (prompt_c - 1) // B)
    k = 0
    while k < limit and hb[k] != 0:
        h = hb[k]
        i = _rslot(phk, h)
        if not (phk[i] == h and phv[i] >= 0) and rk[_rslot(rk, h)] != h:
            break
        k += 1
    while k < limit and hb[k] != 0:
        h = hb[k]
        if tk[hash_slot(tk, h)] != h:
            break
        k += 1
    return k


@njit(cache=True)
def _route_prefix(hb, nb, prompt_c, B, weight, waiting, sts, rks, phks, phvs, tks, i_qn,
                  i_done):
    """The closed loop's ``prefix`` router (:func:`kvsim.modes.closed.routing._route`) in one
    call for every replica ``w``: Dynamo's cost ``weight x (nb - cached_w) + active_w``
    (``cached_w``: :func:`_cached_prefix` on replica ``w``'s pool ``phks[w]``/``phvs[w]``,
    held table ``rks[w]`` and tier table ``tks[w]``; ``active_w``: its held blocks
    ``sts[w][S_HELD]`` plus ``waiting[w]``), lowest wins, ties: fewest outstanding requests
    (``sts[w][i_qn] - sts[w][i_done]``), then lowest index -- the order of the tuples
    ``(cost, outstanding, w)`` in Python, float costs compared as Python compares them.  A
    replica whose cost cannot beat the best even with every block cached (at most
    ``(prompt - 1) // B`` are) is not scored."""
    floor = weight * (nb - min(nb, max((prompt_c - 1) // B, 0)))
    best = 0
    best_c = 0.0
    best_l = 0
    for w in range(len(sts)):
        st = sts[w]
        active = st[S_HELD] + waiting[w]
        load = st[i_qn] - st[i_done]
        if w > 0:
            c0 = floor + active
            if c0 > best_c or (c0 == best_c and load >= best_l):
                continue
        cached = _cached_prefix(hb, nb, prompt_c, B, rks[w], phks[w], phvs[w], tks[w])
        c = weight * (nb - cached) + active
        if w == 0 or c < best_c or (c == best_c and load < best_l):
            best, best_c, best_l = w, c, load
    return best
