"""Ways to serve a trace: cache mode, the closed loop (``closed/``), live offload (``live/``), comparisons."""
