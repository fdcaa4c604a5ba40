"""The kernels compile ahead of time for a Hopper GPU (megaeval.kernels.aot), with no GPU here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megaeval.kernels.common import available


@pytest.mark.skipif(not available(), reason="Triton is not installed")
def test_kernels_compile_for_an_h100_with_their_gpu_configs():
    """Ahead-of-time compilation to sm_90 cubin (needs no GPU), in a process without the interpreter."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "megaeval.kernels.aot", "--arch", "90"], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    built = json.loads(run.stdout)
    assert set(built) == {
        "_cema_kernel", "_timestep_norm_kernel", "_lse_nll_kernel", "_rms_norm_kernel",
        "_silu_mul_kernel", "_rope_kernel",
        "_shared_qk_kernel",
        "_norm_cema_kernel", "_rms_kernel", "_qk_kernel", "_attend_kernel", "_attend_combine_kernel",
        "_residual_layer_norm_kernel",  # the decoding step's (decode_step)
    }  # fmt: skip
    assert all(0 <= k["shared_bytes"] <= 227 * 1024 and k["cubin_bytes"] > 0 for k in built.values())
