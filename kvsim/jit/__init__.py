"""numba plumbing: the on-disk compile cache and compile-time helpers (imports no domain code)."""
