"""The canonical Request table: what every trace reader produces and the lowering consumes.

One row per request, **sorted by** ``arrival_us`` (ties keep input order), with
``request_id == row index`` (dense, 0..N-1).  Columns (all non-null):

==================== ============ =========================================================
column               dtype        meaning
==================== ============ =========================================================
request_id           int64        dense id = row index after sorting by arrival
arrival_us           int64        arrival time, microseconds from trace start (>= 0)
prompt_tokens        int64        prompt (input) tokens, >= 1
output_tokens        int64        tokens to generate, >= 1 (the prefill samples the first)
block_ids            list<int64>  content ids of the trace's native blocks (see below)
hashed_tokens        int64        leading tokens whose content ``block_ids`` identify
session              int64        session / conversation id, -1 = none
tenant               int32        tenant id for per-tenant accounting (0 default)
request_priority     int8         0 (lowest) .. 100 (highest); 50 when unknown
ttft_deadline_us     int64        TTFT budget **relative to arrival**, -1 = none
tpot_deadline_us     int64        per-output-token budget (TPOT), -1 = none
n                    int32        parallel samples (>= 1); n > 1 forks after prefill
beam_width           int32        beam width (>= 1); > 1 forks beams after prefill
model                string       model named by the trace ("" = unknown)
session_continues    bool         the serving layer knows this session sends another turn
next_turn_gap_us     int64        expected gap from this request's finish to the next turn
                                  (serving-layer estimate), -1 = unknown
shared_prefix_tokens int64        leading prompt tokens known to be shared (system prompt)
spec_draft_tokens    int32        speculative decoding: draft tokens per step (0 = off)
spec_accept_prob     float64      probability that each draft token is accepted
==================== ============ =========================================================

Content identity: ``block_ids[j]`` names the content of native block ``j`` (tokens
``[j*T, (j+1)*T)`` with ``T = RequestTable.block_size_tokens``), and two equal ids in the
table mean the same tokens *and the same prefix* (Mooncake's hash ids are prefix hashes;
the agentic reader namespaces ids per conversation; the lowering additionally chains
them, so prefix identity holds for any ids).  ``hashed_tokens`` says how many leading
tokens the ids identify: Mooncake's last (partial) block is identified, so it equals
``prompt_tokens``; agentic ids cover only full 64-token blocks.  It may exceed
``prompt_tokens`` when the trace also knows the output's content (synthetic multi-turn
sessions), which lets decode blocks carry hashes that the next turn's prompt re-uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from kvsim.core.errors import KvsimInputError

#: (name, numpy dtype or "list"/"string", default) of every column, in order.
REQUEST_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("request_id", "int64", None),
    ("arrival_us", "int64", None),
    ("prompt_tokens", "int64", None),
    ("output_tokens", "int64", None),
    ("block_ids", "list", None),
    ("hashed_tokens", "int64", 0),
    ("session", "int64", -1),
    ("tenant", "int32", 0),
    ("request_priority", "int8", 50),
    ("ttft_deadline_us", "int64", -1),
    ("tpot_deadline_us", "int64", -1),
    ("n", "int32", 1),
    ("beam_width", "int32", 1),
    ("model", "string", ""),
    ("session_continues", "bool", False),
    ("next_turn_gap_us", "int64", -1),
    ("shared_prefix_tokens", "int64", 0),
    ("spec_draft_tokens", "int32", 0),
    ("spec_accept_prob", "float64", 0.0),
)
REQUEST_COLUMN_NAMES = tuple(c[0] for c in REQUEST_COLUMNS)


def _released(what: str) -> RuntimeError:
    """The error of a read of what :meth:`RequestTable.release_block_ids` dropped (``what``:
    ``"block ids were"``, ``"column 'x' was"``): one text for every such read."""
    return RuntimeError(f"this table's {what} released (RequestTable.release_block_ids)")


class _Frame:
    """``RequestTable.df``: the DataFrame, built from the table's numpy columns when first
    read (pandas is imported then, not before).  A table built by
    :func:`build_request_table` holds its columns as numpy arrays and its ``block_ids`` as
    one flat int64 array with offsets (CSR): 8 bytes a block id and one offset a request,
    no Python object per request; the closed loop reads them as they are
    (:meth:`RequestTable.column`, :meth:`RequestTable.flat_block_ids`).  Once the
    DataFrame is built (or a table is made of one) it is the table: the columns are read
    from it, so that an edit of ``table.df`` is what every reader sees."""

    def __get__(self, obj, objtype=None):
        if obj is None:
            return None  # the dataclass field's default
        d = obj.__dict__
        if d.get("_df") is None and d.get("_cols") is not None:
            if d["_ids"] is None:
                raise _released("block ids were")
            d["_df"] = _frame(d["_cols"], d["_off"], d["_ids"])
            d["_cols"] = d["_off"] = d["_ids"] = None
        return d.get("_df")

    def __set__(self, obj, value) -> None:
        obj.__dict__.update(_df=value, _cols=None, _off=None, _ids=None)


def _frame(cols: dict, off: np.ndarray, ids: np.ndarray):
    """The Request table's DataFrame (:data:`REQUEST_COLUMNS` in order; ``block_ids`` one
    int64 array per row, views of ``ids``)."""
    import pandas as pd

    data = {}
    for name, dtype, _ in REQUEST_COLUMNS:
        if dtype == "list":
            data[name] = _pieces(off, ids)
        elif dtype == "string":  # an object column (pandas 3 would infer its str dtype)
            data[name] = pd.array(cols[name], dtype=object)
        else:
            data[name] = cols[name]
    return pd.DataFrame(data)


def _pieces(off: np.ndarray, ids: np.ndarray) -> list[np.ndarray]:
    """``ids`` cut at ``off`` (views)."""
    bounds = off.tolist()
    return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass
class RequestTable:
    """A validated canonical Request table plus what the reader learned on the way.

    Invariants (checked by :func:`build_request_table`): sorted by ``arrival_us``;
    ``request_id`` is the row index; every column of :data:`REQUEST_COLUMNS` is present
    with its dtype; values in range (see the column table in the module docstring).
    ``df`` is a pandas DataFrame, built when first read (:class:`_Frame`); code that needs
    no DataFrame reads :meth:`column`, :meth:`columns` and :meth:`flat_block_ids`.
    """

    df: Any = _Frame()
    #: Tokens per native block of the trace (512 Mooncake, 64 agentic, 16 token-id logs).
    block_size_tokens: int = 16
    #: Rows skipped because they were bad (only with ``skip_bad_rows``).
    skipped: int = 0
    #: Format name and reader arguments, recorded in the event-file header.
    source: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_columns(cls, cols: dict[str, np.ndarray], off: np.ndarray, ids: np.ndarray,
                     block_size_tokens: int, skipped: int = 0,
                     source: dict[str, Any] | None = None) -> RequestTable:
        """A table held as numpy columns (every column of :data:`REQUEST_COLUMNS` but
        ``block_ids``, which is ``off``/``ids``: CSR)."""
        t = cls(df=None, block_size_tokens=int(block_size_tokens), skipped=skipped,
                source=dict(source or {}))
        t.__dict__.update(_cols=cols, _off=off, _ids=ids)
        return t

    def _held(self) -> dict | None:
        return self.__dict__.get("_cols")

    def __len__(self) -> int:
        cols = self._held()
        return len(cols["request_id"]) if cols is not None else len(self.df)

    def column(self, name: str) -> np.ndarray:
        """One column (not ``block_ids``) as a numpy array (read-only use)."""
        cols = self._held()
        if cols is None:
            return self.df[name].to_numpy()
        if name not in cols and name in REQUEST_COLUMN_NAMES:
            raise _released(f"column {name!r} was")
        return cols[name]

    def columns(self) -> dict[str, np.ndarray]:
        """Every column but ``block_ids`` and ``model``, name -> numpy array."""
        return {name: self.column(name) for name, dtype, _ in REQUEST_COLUMNS
                if dtype not in ("list", "string")}

    def release_block_ids(self, columns: tuple[str, ...] = ()) -> bool:
        """Drop the block ids (CSR) of a table held as numpy columns, and the named
        ``columns`` (not ``request_id``), once its consumer has read all it needs of them
        (the closed loop of a caller that hands its table over:
        ``kvsim.modes.closed.cluster.serve(release_block_ids=True)``): 8 bytes a block id
        and one offset a request no longer held for the rest of the run.  The other
        columns stay; a later :meth:`flat_block_ids`, ``df``, :meth:`columns` or
        :meth:`column` of a dropped one raises.  False (and nothing dropped) for a table
        held as a DataFrame."""
        cols = self._held()
        if cols is None:
            return False
        keep = {k: v for k, v in cols.items() if k == "request_id" or k not in columns}
        self.__dict__.update(_cols=keep, _off=None, _ids=None)
        return True

    def hold_in(self, store) -> bool:
        """Move the columns and block ids of a table held as numpy columns into ``store``
        (a :class:`kvsim.core.row_store.RowStore`: the same values, memory the closed loop
        gives back below the rows it has passed; issue 38, "Memory").  For a table handed
        over to the run (``kvsim.modes.closed.cluster.serve(release_block_ids=True)``).
        False (nothing moved) for a table held as a DataFrame."""
        cols = self._held()
        if cols is None:
            return False
        d = self.__dict__
        for k in list(cols):  # one at a time: each original freed as its copy is made
            cols[k] = store.copy(np.ascontiguousarray(cols[k]), drop=True)
        if d["_off"] is not None:
            d["_off"] = store.copy(d["_off"], drop=True)
        if d["_ids"] is not None:
            d["_ids"] = store.copy(d["_ids"], drop=True, index=d["_off"])
        return True

    def take(self, keep: np.ndarray) -> RequestTable:
        """The rows where ``keep`` (a bool mask) holds, ``request_id`` re-numbered densely
        (arrival order kept)."""
        cols = self._held()
        if cols is None:
            df = self.df[keep].reset_index(drop=True)
            df["request_id"] = np.arange(len(df), dtype=df["request_id"].dtype)
            return RequestTable(df=df, block_size_tokens=self.block_size_tokens,
                                skipped=self.skipped, source=self.source)
        off, ids = self.flat_block_ids()
        new = {k: v[keep] for k, v in cols.items()}
        new["request_id"] = np.arange(len(new["request_id"]), dtype=np.int64)
        noff, nids = _gather(off, ids, np.flatnonzero(keep))
        return RequestTable.from_columns(new, noff, nids, self.block_size_tokens,
                                         self.skipped, self.source)

    def flat_block_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets int64[N+1], values int64[total]): ``block_ids`` as a CSR pair (the
        table's own arrays when it holds them: read-only use)."""
        if self._held() is not None:
            if self.__dict__["_ids"] is None:
                raise _released("block ids were")
            return self.__dict__["_off"], self.__dict__["_ids"]
        col = self.df["block_ids"]
        lengths = np.fromiter((len(x) for x in col), dtype=np.int64, count=len(col))
        offsets = np.zeros(len(col) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1]:
            values = np.concatenate([np.asarray(x, dtype=np.int64) for x in col if len(x)])
        else:
            values = np.zeros(0, dtype=np.int64)
        return offsets, values


#: Rows gathered per batch by :func:`_gather` (its index arrays are a batch's: 16 Ki rows,
#: ~3 MiB an index array at the ~24 ids a request of the Mooncake conversation trace).
_GATHER_ROWS = 1 << 14


def _gather(off: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR pair of ``rows`` (in that order) of the CSR pair ``off``/``ids``: the new
    ids are the one full-size copy, filled a batch of rows at a time (the source positions
    of every id at once took 3 more arrays of the trace's ids)."""
    lens = off[1:] - off[:-1]
    lens = lens[rows]
    noff = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lens, out=noff[1:])
    out = np.empty(int(noff[-1]), dtype=ids.dtype)
    for a in range(0, len(rows), _GATHER_ROWS):
        b = min(a + _GATHER_ROWS, len(rows))
        lo, hi = int(noff[a]), int(noff[b])
        if lo == hi:
            continue
        # for each output position: its source position (start of its row + rank in the row)
        src = np.repeat(off[rows[a:b]] - noff[a:b], lens[a:b])
        src += np.arange(lo, hi, dtype=np.int64)
        out[lo:hi] = ids[src]
    return noff, out


def csr_block_ids(values) -> tuple[np.ndarray, np.ndarray]:
    """``block_ids`` given as one id list per request (lists or arrays), or already as a
    CSR pair ``(offsets, ids)`` (:class:`CsrIds`), as a CSR pair of int64 arrays."""
    if isinstance(values, CsrIds):
        return (np.ascontiguousarray(values.offsets, dtype=np.int64),
                np.ascontiguousarray(values.ids, dtype=np.int64))
    lens = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    off = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    if not off[-1]:
        return off, np.zeros(0, dtype=np.int64)
    parts = [np.asarray(v, dtype=np.int64) for v in values if len(v)]
    return off, np.concatenate(parts)


@dataclass(frozen=True)
class CsrIds:
    """``block_ids`` of every request as one flat int64 array and ``N + 1`` offsets (what
    a reader that parsed them flat passes to :func:`build_request_table`)."""

    offsets: np.ndarray
    ids: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1


def build_request_table(columns: dict[str, Any], *, block_size_tokens: int, path: str = "",
                        skipped: int = 0, source: dict[str, Any] | None = None,
                        ) -> RequestTable:
    """Assemble, default-fill, sort and validate a Request table from column lists.

    ``columns`` needs at least ``arrival_us``, ``prompt_tokens`` and ``output_tokens``;
    other columns take their defaults.  ``request_id`` is assigned here (stable sort by
    arrival).  Raises :class:`KvsimInputError` naming ``path`` and the offending row
    (the row number is the 1-based position in the reader's output order).
    """
    n = len(columns["arrival_us"])
    if n == 0:
        raise KvsimInputError("expected at least one request, the file holds none"
                              + (f" ({skipped} bad rows skipped)" if skipped else ""),
                              path or None, None, None)
    data: dict[str, Any] = {}
    off = ids = None
    for name, dtype, default in REQUEST_COLUMNS:
        if name == "request_id":
            continue
        if name in columns:
            values = columns[name]
        elif name == "block_ids":
            values = CsrIds(np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))
        elif dtype == "string":  # the default's str, one object for every row
            data[name] = np.full(n, str(default), dtype=object)
            continue
        else:  # no list of n defaults first
            data[name] = np.full(n, default, dtype=dtype)
            continue
        try:
            if dtype == "list":
                off, ids = csr_block_ids(values)
            elif dtype == "string":
                data[name] = np.array([str(v) for v in values], dtype=object)
            else:
                data[name] = np.asarray(values, dtype=dtype)
        except (OverflowError, ValueError, TypeError):
            raise _first_unrepresentable(values, name, dtype, path) from None
    if block_size_tokens <= 0:
        raise KvsimInputError(f"native block size must be >= 1 token, got {block_size_tokens}",
                              path or None, None, "block_size_tokens")
    _validate(data, off, path, block_size_tokens)
    cols = {"request_id": np.arange(n, dtype=np.int64)}
    arrival = data["arrival_us"]
    if (arrival[1:] >= arrival[:-1]).all():  # sorted: the stable sort is the identity
        cols.update(data)
    else:
        order = np.argsort(arrival, kind="stable")
        copies: dict[int, np.ndarray] = {}  # a column given twice (hashed = prompt) stays one
        for k, v in data.items():
            cols[k] = copies[id(v)] = copies[id(v)] if id(v) in copies else v[order]
        del copies
        off, ids = _gather(off, ids, order)
    return RequestTable.from_columns(cols, off, ids, int(block_size_tokens), skipped,
                                     source)


def _first_unrepresentable(values, name: str, dtype: str, path: str) -> KvsimInputError:
    """The error for the first value of a column that does not fit its dtype."""
    target = np.int64 if dtype == "list" else np.dtype(dtype)
    for row, v in enumerate(values):
        try:
            np.asarray(v, dtype=target)
        except (OverflowError, ValueError, TypeError):
            shown = v if dtype != "list" else f"a list holding {max(v, key=abs)!r}"
            return KvsimInputError(f"expected a value that fits {np.dtype(target).name}, got "
                                   f"{shown!r}", path or None, f"request {row + 1}", name)
    return KvsimInputError(f"expected values that fit {np.dtype(target).name}", path or None,
                           None, name)


def _check(mask: np.ndarray, df: dict, path: str, field_name: str, expected: str):
    bad = np.flatnonzero(~mask)
    if bad.size:
        row = int(bad[0])
        value = df[field_name][row]
        value = value.item() if hasattr(value, "item") else value
        raise KvsimInputError(f"expected {expected}, got {value!r}",
                              path or None, f"request {row + 1}", field_name)


def _validate(df: dict, off: np.ndarray, path: str, block_size_tokens: int) -> None:
    """Every value in range (``df``: the columns, name -> numpy array, in the reader's
    order; ``off``: ``block_ids``' offsets); the first bad one raises."""
    from kvsim.core.limits import get_limits

    lim = get_limits()
    note = " (kvsim limit, KVSIM_LIMIT_{} / --limit; docs/cli.md)"
    _check(df["arrival_us"] <= lim.max_time_us, df, path, "arrival_us",
           f"a time <= {lim.max_time_us:,} us after the first request"
           + note.format("MAX_TIME_US"))
    _check(df["prompt_tokens"] <= lim.max_prompt_tokens, df, path,
           "prompt_tokens", f"at most {lim.max_prompt_tokens:,} tokens"
           + note.format("MAX_PROMPT_TOKENS"))
    _check(df["output_tokens"] <= lim.max_output_tokens, df, path,
           "output_tokens", f"at most {lim.max_output_tokens:,} tokens"
           + note.format("MAX_OUTPUT_TOKENS"))
    for name in ("n", "beam_width"):
        _check(df[name] <= lim.max_fanout, df, path, name,
               f"at most {lim.max_fanout}" + note.format("MAX_FANOUT"))
    total = int(df["prompt_tokens"].sum()) + int(df["output_tokens"].sum())
    if total > lim.max_total_tokens:
        raise KvsimInputError(f"expected at most {lim.max_total_tokens:,} tokens in the whole "
                              f"trace, got {total:,}" + note.format("MAX_TOTAL_TOKENS"),
                              path or None, None, "prompt_tokens + output_tokens")
    _check(df["arrival_us"] >= 0, df, path, "arrival_us", "a time >= 0")
    _check(df["prompt_tokens"] >= 1, df, path, "prompt_tokens", "an integer >= 1")
    _check(df["output_tokens"] >= 1, df, path, "output_tokens", "an integer >= 1")
    rp = df["request_priority"]
    _check((rp >= 0) & (rp <= 100), df, path, "request_priority", "0..100")
    _check(df["n"] >= 1, df, path, "n", "an integer >= 1")
    _check(df["beam_width"] >= 1, df, path, "beam_width", "an integer >= 1")
    ids_len = off[1:] - off[:-1]
    ht = df["hashed_tokens"]
    _check((ht >= 0) & (ht <= ids_len * block_size_tokens), df, path, "hashed_tokens",
           "at most len(block_ids) x block size tokens")
    p = df["spec_accept_prob"]
    _check((p >= 0.0) & (p <= 1.0), df, path, "spec_accept_prob", "a probability in [0, 1]")
    _check(df["spec_draft_tokens"] >= 0, df, path, "spec_draft_tokens", ">= 0")
    for name in ("ttft_deadline_us", "tpot_deadline_us", "next_turn_gap_us"):
        v = df[name]
        _check((v == -1) | (v > 0), df, path, name, "a positive duration or -1 (none)")


def to_arrow(table: RequestTable) -> pa.Table:
    """The Request table as Arrow (what ``--requests-out`` / users read with pandas)."""
    df = table.df
    arrays = {}
    for name, dtype, _ in REQUEST_COLUMNS:
        if dtype == "list":
            arrays[name] = pa.array(list(df[name]), type=pa.list_(pa.int64()))
        elif dtype == "string":
            arrays[name] = pa.array(list(df[name]), type=pa.string())
        else:
            arrays[name] = pa.array(df[name].to_numpy())
    return pa.table(arrays)


def salt_block_ids(table: RequestTable, salts) -> RequestTable:
    """``table`` with each request's ``block_ids`` moved into the namespace of its salt
    (``salts[i]``: a string, or None / "" for no salt): ``namespaced_ids(BLAKE2b("salt:" +
    salt), ids)``.  vLLM salts only a request's first block (``cache_salt``); every later
    hash chains through it, so salting every id gives the same sharing: requests with
    different salts never share a block, requests with the same salt share exactly what
    they shared before.  Rows without ids are unchanged."""
    from kvsim.ingest.hashing import name_hash, namespaced_ids

    df = table.df.copy()
    cache: dict[str, int] = {}
    out = []
    for ids, salt in zip(df["block_ids"], salts):
        if salt is None or salt == "" or len(ids) == 0:
            out.append(ids)
            continue
        ns = cache.setdefault(str(salt), name_hash("salt:" + str(salt)))
        out.append(namespaced_ids(ns, np.asarray(ids, dtype=np.int64)))
    df["block_ids"] = out
    source = dict(table.source)
    return RequestTable(df=df, block_size_tokens=table.block_size_tokens,
                        skipped=table.skipped, source=source)


def salt_by_tenant(table: RequestTable) -> RequestTable:
    """``table`` salted by tenant (``--salt-by-tenant``): the salt of a request is
    ``"tenant:<id>"``, so two tenants never share a prompt block (vLLM's per-tenant
    ``cache_salt``), and one tenant's requests share as before."""
    out = salt_block_ids(table, [f"tenant:{t}" for t in table.df["tenant"]])
    out.source["salt_by_tenant"] = True
    return out
