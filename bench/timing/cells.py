"""The comparison grid of bench/timing/bench_step_time.py and tests/timing/test_measured.py,
and how the measured model answers each cell.  Pure stdlib: no AIConfigurator, no kvsim.

Kinds of cell (one engine, all TP ranks; ms):

  prefill  ``batch`` prompts of ``prompt_tokens`` each in one step: ``chunk_tokens`` new ones
           after ``context_tokens`` already cached (0 for a cold prompt)
  decode   ``batch`` sequences of ``context_tokens`` each, one token each
  mixed    vLLM chunked prefill as AIConfigurator's mixed step defines it: a ``prompt_tokens``
           prompt prefilled in chunks of ``chunk_tokens`` (one chunk per step) beside
           ``batch`` decoding sequences at ``context_tokens``; AIConfigurator gives the mean
           step of that prefill (its context attention is the whole prompt's divided by
           the number of chunks), so the model's answer is the mean of its steps over the
           chunk positions 0, C, 2C, ...
  tpot     AIConfigurator's TPOT: ``batch`` sequences decoding ``osl`` tokens after a
           ``prompt_tokens`` prompt, the mean decode step (contexts prompt+1 .. prompt+osl-1)
  ttft     a lone prompt's prefill step (the issue's reference points)
"""

from __future__ import annotations

from dataclasses import dataclass

# Grid values mix the profile tables' nodes (powers of two) with points between them, so
# the comparison also measures interpolation.
PREFILL_BATCH = (1, 2, 3, 4, 8, 12, 16, 32, 64)
PROMPTS = (1000, 2048, 3000, 6000, 8192, 12000, 20000, 32768)
MAX_PREFILL_TOKENS = 65536  # prefill cells keep batch * new tokens at or under this
# prefills after a prefix-cache hit: batch x new tokens x cached tokens
CACHED_BATCH = (1, 4, 16, 64)
CACHED_NEW = (128, 512, 2048, 8192)
CACHED_BEFORE = (1000, 8192, 30000)
DECODE_BATCH = (1, 3, 8, 16, 24, 64, 100, 128, 200, 256)
CONTEXTS = (1000, 2048, 3000, 6000, 8192, 12000, 20000, 32768)
# (prompt, chunk) of the mixed cells: each prompt a whole number of chunks
MIXED = ((1024, 512), (3000, 1000), (4096, 2048), (8192, 8192), (12000, 3000), (16384, 512),
         (16384, 8192), (24000, 6000), (32768, 2048), (32000, 8000))
MIXED_DECODE_BATCH = (1, 12, 64, 200)
TPOT = tuple((b, s) for b in (1, 16, 64, 128) for s in (1000, 2000, 4000, 8000))
TPOT_OSL = 1000
TTFT_PROMPTS = (1000, 8000)
STEP_KINDS = ("prefill", "decode", "mixed")  # the kinds the step MAPE is over

# The reference points (AIConfigurator on Llama-3.1-8B bf16, H100 SXM, vLLM):
# (kind, batch, prompt_tokens, ms).  TPOT is AIConfigurator's (osl 1000).
REFERENCE = (
    ("ttft", 1, 1000, 21.6),
    ("ttft", 1, 8000, 194.0),
    ("tpot", 1, 1000, 6.2),
    ("tpot", 16, 8000, 13.3),
    ("tpot", 64, 4000, 18.9),
    ("tpot", 128, 2000, 20.5),
)
REFERENCE_CONFIG = ("h100-sxm", "llama-3.1-8b", 1)

COLUMNS = ("kind", "gpu", "model", "tp", "batch", "prompt_tokens", "chunk_tokens",
           "context_tokens", "osl", "aic_ms")


@dataclass(frozen=True)
class Cell:
    kind: str
    batch: int
    prompt_tokens: int = 0
    chunk_tokens: int = 0
    context_tokens: int = 0
    osl: int = 0

    def label(self) -> str:
        if self.kind == "prefill":
            cached = f" ({self.context_tokens} cached)" if self.context_tokens else ""
            return f"prefill b={self.batch} prompt={self.prompt_tokens}{cached}"
        if self.kind == "decode":
            return f"decode b={self.batch} ctx={self.context_tokens}"
        if self.kind == "mixed":
            return (f"mixed prompt={self.prompt_tokens} chunk={self.chunk_tokens} "
                    f"+ {self.batch} dec @ctx={self.context_tokens}")
        if self.kind == "tpot":
            return f"tpot b={self.batch} isl={self.prompt_tokens} osl={self.osl}"
        return f"ttft prompt={self.prompt_tokens}"


def reference_cell(kind: str, batch: int, prompt_tokens: int) -> Cell:
    """The cell of one of REFERENCE's points."""
    if kind == "ttft":
        return Cell("ttft", batch, prompt_tokens, prompt_tokens, 0)
    return Cell("tpot", batch, prompt_tokens, 0, prompt_tokens, TPOT_OSL)


def grid() -> list[Cell]:
    cells = []
    for s in PROMPTS:
        for b in PREFILL_BATCH:
            if b * s <= MAX_PREFILL_TOKENS:
                cells.append(Cell("prefill", b, s, s, 0))
    for p in CACHED_BEFORE:
        for n in CACHED_NEW:
            for b in CACHED_BATCH:
                if b * n <= MAX_PREFILL_TOKENS:
                    cells.append(Cell("prefill", b, n + p, n, p))
    for c in CONTEXTS:
        for b in DECODE_BATCH:
            cells.append(Cell("decode", b, 0, 0, c))
    for s, ch in MIXED:
        for b in MIXED_DECODE_BATCH:
            for osl in (2, 2 * s):  # decoding sequences at context s+2 or 2s+1
                cells.append(Cell("mixed", b, s, ch, s + osl // 2 + 1, osl))
    for b, s in TPOT:
        cells.append(reference_cell("tpot", b, s))
    for s in TTFT_PROMPTS:
        cells.append(reference_cell("ttft", 1, s))
    return cells


def model_ms(m, cell: Cell) -> float:
    """The measured model's answer for one cell (``m`` a MeasuredStepTime)."""
    k = cell.kind
    if k in ("prefill", "ttft"):
        return m.prefill_ms(cell.chunk_tokens, cell.batch, cell.context_tokens)
    if k == "decode":
        return m.decode_ms(cell.batch, cell.context_tokens)
    if k == "mixed":
        s, ch, b = cell.prompt_tokens, cell.chunk_tokens, cell.batch
        dec_sum = float(b * cell.context_tokens)
        starts = range(0, s, ch)
        return sum(m.step_ms_sums(((min(ch, s - p), p),), b, dec_sum) for p in starts) / len(starts)
    if k == "tpot":
        b, s = cell.batch, cell.prompt_tokens
        steps = range(1, cell.osl)
        return sum(m.decode_ms(b, s + i) for i in steps) / len(steps)
    raise ValueError(f"unknown cell kind {k!r}")


def summarize(errors: list[float]) -> tuple[float, float]:
    """(mean, worst) of |error| over cells."""
    a = [abs(e) for e in errors]
    return (sum(a) / len(a), max(a)) if a else (0.0, 0.0)
