"""Ingest: trace readers -> canonical Request table -> MemoryIntent events (lowering)."""
