"""The serving engine: the continuous-batching scheduler, step timing, and lowering requests to events."""
