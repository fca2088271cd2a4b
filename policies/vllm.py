"""vLLM v1's free-queue order (vllm/v1/core/kv_cache_utils.py ``FreeKVCacheBlockQueue``).

vLLM keeps cached blocks with ref count 0 in one doubly linked free queue and allocates
(evicting lazily) from its HEAD.  A freed block is appended to the TAIL if it has a content
hash, or put at the HEAD if it has none (a partial block is worth nothing to the cache).
A block hit by a new request is ``touch``ed out of the middle of the queue (``on_hold``)
and re-appended when released again (``on_release``).  So the order is exactly "FIFO of
release", and this policy is just that list.  The memory core relies on it being exact.
New content is inserted and held at once in HBM, so only releases order the queue.

In the single-tier cache simulator a hit means "a request touched the block and released
it again", so ``on_hit`` moves a candidate to the tail (which makes it LRU there); a hit
on a held block changes nothing (its release will append it).
Score: ``last_access_us``.
"""

from numba import njit

from kvsim.policy.api import (
    StateSpec,
    dll_contains,
    dll_ends,
    dll_links,
    dll_move_to_tail,
    dll_push_head,
    dll_push_tail,
    dll_remove,
    list_walk,
)

NAME = "vllm"
DESCRIPTION = "vLLM v1 free queue: evict in order of release (unhashed blocks first)."
OFFLINE = False
REASONS = ("vLLM free queue: released before every other cached block",
           "vLLM free queue: no content hash, so it was queued at the head")

STATE = StateSpec(i64=("prev", "nxt",  # queue links
                        "queue"))  # the free queue's [head, tail, size], head = next out


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    return STATE.new(prev=prev, nxt=nxt, queue=dll_ends())


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    if view.content_hash[b] == 0:
        dll_push_head(state.prev, state.nxt, state.queue, b)
    else:
        dll_push_tail(state.prev, state.nxt, state.queue, b)


@njit(cache=True)
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    if dll_contains(state.prev, b):
        dll_move_to_tail(state.prev, state.nxt, state.queue, b)


@njit(cache=True)
def on_hold(state, view, b):
    state = STATE.of(state)
    dll_remove(state.prev, state.nxt, state.queue, b)


@njit(cache=True)
def on_release(state, view, b, now_us):
    on_insert(state, view, b, now_us)


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    dll_remove(state.prev, state.nxt, state.queue, b)


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    b = state.queue[0]
    if b < 0:
        return -1, 0, 0
    n_alt = list_walk(state.prev, state.nxt, state.queue, alt_blocks, alt_scores,
                      view.last_access_us)
    return b, (1 if view.content_hash[b] == 0 else 0), n_alt
