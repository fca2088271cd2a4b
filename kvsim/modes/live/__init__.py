"""Live offload: running requests' KV spilled to lower tiers and brought back before use."""
