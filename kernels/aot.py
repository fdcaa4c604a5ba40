"""Compile every kernel for an NVIDIA GPU without one (Triton's ahead-of-time path, down to cubin), in
bfloat16 with the block sizes a GPU run of a 7B-shaped model would use: proof that they build.

    python -m megaeval.kernels.aot            # sm_90 (H100/H200); --arch 80 for A100
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import MegaevalError
from . import attention, cema, nll, rms_norm, silu_mul, timestep_norm
from .common import interpreting, triton


def cases() -> list[tuple[Any, dict[str, Any], set[str]]]:
    """(kernel, its GPU config and constexprs, its float32 pointer arguments); the others are bfloat16."""
    gpu_dot = {"DOT_FP32": False, "PRECISION": "tf32"}
    return [
        (cema._cema_kernel, {**cema._config(4096, 16), "FINAL": True},
         {"h_in_ptr", "h_out_ptr", "ends_ptr", "p_ptr", "q_ptr", "q_tile_ptr", "q_block_ptr", "gamma_ptr",
          "omega_ptr"}),
        (timestep_norm._timestep_norm_kernel, {**timestep_norm._config(4096, 64), "FINAL": True},
         {"stats_in_ptr", "stats_out_ptr"}),
        (attention._chunk_attention_kernel, {**attention._config(256, 2048), **gpu_dot}, set()),
        (nll._lse_nll_kernel, {"BLOCK_V": nll._block_v(32000), "num_warps": 8}, {"nll_ptr"}),
        (rms_norm._rms_norm_kernel, {"AFFINE": True, "BLOCK_N": 4096, "num_warps": 8}, set()),
        (silu_mul._silu_mul_kernel, {"BLOCK": 2048, "num_warps": 8}, set()),
    ]  # fmt: skip


def compile_all(arch: int = 90) -> dict[str, dict[str, int]]:
    """Compile each kernel for sm_`arch`; returns each one's shared memory and cubin size in bytes."""
    if triton is None:
        raise SystemExit("ahead-of-time compilation needs Triton, which is not installed")
    try:
        interpreted = interpreting()  # the kernels' mode, fixed when Triton was imported
    except MegaevalError as e:
        raise SystemExit(f"error: {e}") from None
    if interpreted:
        raise SystemExit("unset TRITON_INTERPRET: ahead-of-time compilation needs Triton's compiler")
    from triton.backends.compiler import GPUTarget

    out = {}
    for fn, cfg, fp32_ptrs in cases():
        options = {k: cfg[k] for k in ("num_warps", "num_stages") if k in cfg}
        constants = {k: v for k, v in cfg.items() if k not in options}
        signature = {}
        for name in fn.arg_names:
            if name in constants:
                signature[name] = "constexpr"
            elif name.endswith("_ptr"):
                signature[name] = "*i64" if name == "t_ptr" else "*fp32" if name in fp32_ptrs else "*bf16"
            else:
                signature[name] = "fp32" if name == "eps" else "i32"
        source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constants)
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
        out[fn.fn.__name__] = {"shared_bytes": compiled.metadata.shared, "cubin_bytes": len(compiled.asm["cubin"])}
    return out


def main() -> None:
    """Command line: compile everything and print what each kernel needs."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 (H100), 80 (A100)")
    print(json.dumps(compile_all(parser.parse_args().arch), indent=1))


if __name__ == "__main__":
    main()
