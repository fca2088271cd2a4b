"""What CUDA this process could use: a real GPU, numba's CUDA simulator, or none.

:func:`detect` never raises.  It imports ``numba.cuda`` (the only way to ask), so call it
only when the CUDA backend is asked for; importing :mod:`kvsim.backends` does not call it.
"""

from __future__ import annotations

import os
import warnings
from typing import Literal

Detected = Literal["gpu", "cudasim", "none"]


def simulator_requested() -> bool:
    """True when ``NUMBA_ENABLE_CUDASIM`` asks numba for its CUDA simulator.

    Reads numba's own config when numba is already imported (it fixes the value at import),
    else the environment variable, so the answer matches what ``numba.cuda`` will do."""
    try:
        from numba import config

        return bool(config.ENABLE_CUDASIM)
    except Exception:  # noqa: BLE001 - detection never raises
        return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def detect() -> Detected:
    """``"gpu"`` if a CUDA GPU is usable, ``"cudasim"`` if numba's simulator is active,
    ``"none"`` otherwise (no driver, no device, numba-cuda missing or broken)."""
    try:
        if simulator_requested():
            from numba import cuda  # noqa: F401 - the simulator imports without a driver

            return "cudasim"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from numba import cuda

            return "gpu" if cuda.is_available() else "none"
    except Exception:  # noqa: BLE001 - detection never raises
        return "none"


def kernel_compiler_problem() -> str | None:
    """Why numba-cuda could not compile a kernel here, or None when it can.

    numba-cuda builds its typing registries at the first kernel compile, not at import, so a
    broken pairing shows only at the first launch, deep inside numba.  Seen on an H200
    (2026-11-30): numba-cuda 0.30.4 (the last release; in maintenance mode) with numpy 2.5,
    which removed ``np.row_stack``: ``numba.cuda.cudaimpl`` fails to import with
    ``AttributeError: module 'numpy' has no attribute 'row_stack'``
    (https://github.com/NVIDIA/numba-cuda/issues/907; the 'cuda' extra pins numpy < 2.5).
    Importing that module is what the first compile does, so this asks the same question
    before any work.  Never raises."""
    if simulator_requested():
        return None  # the simulator interprets kernels: no compiler, no registries
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import numba.cuda.cudaimpl  # noqa: F401 - the module the first compile imports
    except Exception as e:  # noqa: BLE001 - reported, never raised
        return f"{type(e).__name__}: {e}"
    return None


def refuse_unmeasurable(backend: str) -> None:
    """Raise :class:`KvsimInputError` unless ``backend`` can take real timings here.

    ``cpu`` always can.  ``cuda`` needs a real GPU: the numba CUDA simulator runs the same
    kernels (good for checking bytes) but its timings are not hardware measurements, so
    calibration and placement replay refuse them."""
    from kvsim.core.errors import KvsimInputError

    if backend != "cuda":
        return
    found = detect()
    if found == "cudasim":
        raise KvsimInputError(
            "refusing to time under the numba CUDA simulator (NUMBA_ENABLE_CUDASIM is set): "
            "its timings are not hardware measurements; unset it on a machine with a GPU, "
            "or use --backend cpu", field="backend")
    if found == "none":
        raise KvsimInputError("expected a CUDA GPU for --backend cuda, found none (no driver, "
                              "no device or numba-cuda missing); use --backend cpu",
                              field="backend")
