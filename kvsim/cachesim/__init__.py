"""Single-tier cache simulation: one key stream through one cache, and one-pass hit-rate curves."""
