"""kvsim.numba_speed: numba's TargetConfig.values() patched for speed gives exactly what
numba's own gives (same keys, order, values), so overload caches key as before."""

from __future__ import annotations

import subprocess
import sys

from numba.core import targetconfig
from numba.core.compiler import Flags

from kvsim import numba_speed


def _flag_sets() -> list[Flags]:
    plain = Flags()
    some = Flags()
    some.nrt = True
    some.no_cpython_wrapper = True
    some.error_model = "numpy"
    copied = some.copy()
    copied.inline = "always"
    back_to_default = Flags()
    back_to_default.nrt = False  # set explicitly to its default value
    return [plain, some, copied, back_to_default]


def test_values_are_numbas_own() -> None:
    numba_speed.install()
    assert targetconfig.TargetConfig.values is numba_speed._values
    original = numba_speed.ORIGINAL_VALUES
    assert original is not None and original is not numba_speed._values
    for flags in _flag_sets():
        fast, slow = flags.values(), original(flags)
        assert fast == slow
        assert list(fast) == list(slow)  # same order of keys
        assert len(fast) == len(Flags.options) > 10


def test_equality_and_hash_unchanged() -> None:
    numba_speed.install()
    plain, some, copied, back_to_default = _flag_sets()
    assert plain == back_to_default and hash(plain) == hash(back_to_default)
    assert some != copied and some == some.copy() and hash(some) == hash(some.copy())
    assert plain != some


def test_opt_out_leaves_numba_alone() -> None:
    code = ("import kvsim.numba_speed as s; from numba.core import targetconfig as t; "
            "s.install(); print(t.TargetConfig.values is s._values)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"KVSIM_NUMBA_PATCHES": "0", "PATH": "/usr/bin:/bin"},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
