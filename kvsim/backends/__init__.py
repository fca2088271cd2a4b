"""Real KV block pools for calibration and placement replay: ``cpu`` and ``cuda`` backends.

- :mod:`kvsim.backends.base`: :class:`BlockLayout`, the :class:`KvBackend` interface.
- :mod:`kvsim.backends.cpu`: numpy pool + numba copy loops (:mod:`kvsim.backends.kernels`)
  + file I/O.
- :mod:`kvsim.backends.cuda`: numba-cuda kernels, mapped pinned host tier, CUDA events.
- :mod:`kvsim.backends.disk`: the disk tier (``preadv``/``pwritev``, ``O_DIRECT``).
- :mod:`kvsim.backends.detection`: :func:`detect` -> ``"gpu" | "cudasim" | "none"``.

Importing this package imports nothing CUDA; :func:`open_backend` imports
:mod:`kvsim.backends.cuda` only for ``"cuda"``.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.backends.base import CALIBRATION_LAYOUT, BlockLayout, DeviceInfo, KvBackend  # noqa: F401
from kvsim.backends.detection import (  # noqa: F401
    detect,
    kernel_compiler_problem,
    refuse_unmeasurable,
)
from kvsim.core.errors import KvsimInputError

#: Backend names accepted by ``--backend``.
BACKEND_NAMES = ("cpu", "cuda")


def open_backend(name: str, layout: BlockLayout, *, device_blocks: int, host_blocks: int,
                 staging_blocks: int, disk_blocks: int, disk_dir: str | Path | None = None,
                 seed: int = 0, direct_io: bool = True, cpu_timer: str = "thread"
                 ) -> KvBackend:
    """Build the named backend with the given tier sizes (in blocks).  ``cpu_timer``
    (``"thread"`` or ``"wall"``) selects the cpu backend's memory-copy clock.

    ``"cuda"`` requires a real GPU or the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``);
    otherwise this raises :class:`KvsimInputError` naming what :func:`detect` found.
    """
    kwargs = dict(device_blocks=device_blocks, host_blocks=host_blocks,
                  staging_blocks=staging_blocks, disk_blocks=disk_blocks, disk_dir=disk_dir,
                  seed=seed, direct_io=direct_io)
    if name == "cpu":
        from kvsim.backends.cpu import CpuBackend

        return CpuBackend(layout, timer=cpu_timer, **kwargs)
    if name == "cuda":
        found = detect()
        if found == "none":
            raise KvsimInputError("expected a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1 for the "
                                  "simulator), found none: install the 'cuda' extra and a "
                                  "driver, or use --backend cpu", field="backend")
        problem = kernel_compiler_problem()
        if problem is not None:
            import numba
            import numpy

            new_numpy = tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 5)
            hint = ("numba-cuda 0.30 predates numpy 2.5: pip install 'numpy<2.5' (kvsim's "
                    "'cuda' extra pins it)" if new_numpy else "reinstall kvsim's 'cuda' extra")
            raise KvsimInputError(
                f"expected numba-cuda able to compile kernels for --backend cuda, got "
                f"{problem} (numba {numba.__version__}, numpy {numpy.__version__}); {hint}, "
                "or use --backend cpu", field="backend")
        from kvsim.backends.cuda import CudaBackend

        return CudaBackend(layout, **kwargs)
    raise KvsimInputError(f"expected one of {', '.join(BACKEND_NAMES)}, got {name!r}",
                          field="backend")
