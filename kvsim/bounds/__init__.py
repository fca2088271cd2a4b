"""Offline bounds: the prefix-cache optimum in cache mode and the live-offload optimum."""
