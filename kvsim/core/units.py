"""Units shared by every layer.

``GB`` is the SI gigabyte (10^9 bytes), the unit of every ``*_gb`` option and of GPU memory
and bandwidth datasheets (NVIDIA's "80 GB" H100 and its TB/s are decimal)."""

#: Bytes in one SI gigabyte (10^9), the unit of ``--hbm-gb`` and friends.
GB = 1_000_000_000
