#!/usr/bin/env bash
# The lost-store miscompile behind kvsim/replay/kernel/core_ref.py's rule "members are read
# one per statement" (docs/jit.md, "The one workaround"), reproduced with no patch of numba
# (kvsim writes nothing into numba since #31).
#
# Copies the checkout's HEAD to a scratch folder, rewrites seven member reads of
# kvsim.replay.kernel.placement._place into ONE tuple-unpacking statement
#     st, out, hbuf, scr, pst, view, G = cr.st, cr.out, cr.hbuf, cr.scr, cr.pst, cr.H_view, cr.G
# (the same values, the same order) and runs the compiled-vs-reference replay test on an
# empty numba cache.  Expected with the workaround's premise true: the test FAILS (the
# HBM view's content_hash / access_count stores are lost: the decision log's candidates show
# 0 where the reference has the block's hash and count 1).
#
# Usage: bench/numba_repro/core_ref_unpack.sh [PYTHON] [NUMBA_OPT]   (~3-4 CPU-min: the core
# compiles cold).  PYTHON: an interpreter with kvsim's dependencies and pytest.
set -eu
PY=${1:-python}
OPT=${2:-1}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=$(mktemp -d /tmp/kvsim-core-ref-repro.XXXXXX)
git -C "$root" archive HEAD | tar -x -C "$work"
"$PY" - "$work/kvsim/replay/kernel/placement.py" <<'PYEOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = ("    st = cr.st\n    out = cr.out\n    hbuf = cr.hbuf\n    scr = cr.scr\n"
       "    pst = cr.pst\n    view = cr.H_view\n    G = cr.G\n    step = int(C[C_STEP])")
new = ("    st, out, hbuf, scr, pst, view, G = cr.st, cr.out, cr.hbuf, cr.scr, cr.pst, "
       "cr.H_view, cr.G\n    step = int(C[C_STEP])")
assert s.count(old) == 1, "placement._place no longer reads its members as expected"
open(p, "w").write(s.replace(old, new))
PYEOF
"$PY" -c "import numba, llvmlite, sys; print('numba', numba.__version__, 'llvmlite', llvmlite.__version__, 'python', sys.version.split()[0])"
cd "$work"
set +e
PYTHONPATH="$work" NUMBA_OPT=$OPT NUMBA_CACHE_DIR="$work/numba-cache" \
  "$PY" -m pytest -q -p no:cacheprovider -x tests/sim/test_compiled_reference.py -k arc
rc=$?
echo "NUMBA_OPT=$OPT: pytest exit $rc (1 = reproduced: compiled replay differs from the reference)"
rm -rf "$work"
exit 0
