"""The tiered replay: driver, pre-pass and metrics; ``replay/kernel/`` holds the compiled core."""
