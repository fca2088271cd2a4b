"""kvsim's ``njit`` (kvsim.jit.decorators): compile options decided at decoration time, and
the interpreted twin built by kvsim's own switch, never by replacing ``numba.njit``."""

from __future__ import annotations

import numba
from numba.core.dispatcher import Dispatcher

from kvsim.jit.decorators import interpreting, is_interpreting, njit


def test_njit_compiles_and_drops_the_c_wrapper_unless_first_class():
    @njit(cache=False)
    def add(a, b):
        return a + b

    assert isinstance(add, Dispatcher) and add(2, 3) == 5
    assert add.targetoptions.get("no_cfunc_wrapper") is True

    @njit
    def bare(a):
        return a

    assert isinstance(bare, Dispatcher) and bare(4) == 4


def test_interpreting_leaves_functions_as_python_and_numba_untouched():
    before = numba.njit
    with interpreting():
        assert is_interpreting()

        @njit(cache=True)
        def f(x):
            return x + 1

        with interpreting():  # nested
            pass
        assert is_interpreting()
    assert not is_interpreting()
    assert not isinstance(f, Dispatcher) and f(1) == 2
    assert numba.njit is before


def test_the_twin_is_python_and_the_compiled_modules_stay_compiled():
    from kvsim.memory import fast
    from kvsim.replay import variants
    from kvsim.replay.kernel import core, placement

    tw = variants.interpreted()
    assert tw.INTERPRETED and not isinstance(tw.run, Dispatcher)
    assert isinstance(core.run, Dispatcher) and isinstance(placement._place, Dispatcher)
    # the twin's dependencies are twins too: no compiled function receives Python objects
    assert not isinstance(tw.mem.pool_check, Dispatcher)
    assert tw.mem is not fast and isinstance(fast.pool_check, Dispatcher)
