"""Replay: the tiered replay loop, cost model, metrics, and the single-tier cache simulator."""
