"""Foundations every layer may import: the event schema, errors, limits, file helpers, worker processes."""
