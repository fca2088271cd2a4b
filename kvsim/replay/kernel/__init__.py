"""The compiled replay core: tier state, placement, spills and bookkeeping (numba code only)."""
