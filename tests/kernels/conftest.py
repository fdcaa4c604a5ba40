"""The kernel tests run in Triton's CPU interpreter (float32, small sizes), and only they do."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from megaeval.kernels.common import available


def _take_triton() -> dict[str, ModuleType]:
    """Remove Triton's Python modules from sys.modules and return them; its native libtriton (triton._C)
    stays, since it cannot be loaded twice (every import of Triton shares it)."""
    names = [n for n in sys.modules if (n == "triton" or n.startswith("triton.")) and not n.startswith("triton._C")]
    return {name: sys.modules.pop(name) for name in names}


@pytest.fixture(scope="package", autouse=True)
def triton_interpreter() -> Iterator[None]:
    """TRITON_INTERPRET=1, and a Triton imported under it, for the tests in this folder only.

    Triton 3.9 reads TRITON_INTERPRET whenever `triton.jit` decorates a function (knobs.runtime.interpret
    reads os.environ on each access), never at launch: an interpreted function stays interpreted, a
    jitted one compiled. Triton's own library functions (tl.sum, tl.max, ...) are decorated when Triton
    is imported, megaeval's kernels when first launched, once per import of Triton
    (megaeval.kernels.common.LateKernel). So this folder gets its own import of Triton: any Triton already
    imported is set aside, the variable set, and Triton imported afresh, interpreted. Afterwards the
    interpreted Triton is set aside, and the variable and the previous Triton (or none) come back: later
    tests never see the variable, and `import triton` gives them a compiling Triton, whose kernels
    LateKernel builds anew.
    """
    if not available():  # the test modules skip themselves
        yield
        return
    before = _take_triton()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        try:
            import triton

            triton._C = sys.modules["triton._C"]  # the attribute a first import binds
            yield
        finally:
            interpreted = _take_triton()
            # kept in sys.modules under other names, so that interpreter shutdown tears them down like any
            # module (left unreferenced there, libtriton's nanobind bindings report leaks at exit)
            sys.modules.update({f"_interpreted_triton.{name}": module for name, module in interpreted.items()})
            sys.modules.update(before)
