"""Compile every kernel for an NVIDIA GPU without one (Triton's ahead-of-time path, down to cubin), in
bfloat16 with the block sizes a GPU run of a 7B-shaped model would use: proof that they build.

    python -m megaeval.kernels.aot            # sm_90 (H100/H200); --arch 80 for A100
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import MegaevalError
from . import attention, cema, decode_attention, decode_norm, nll, rms_norm, shared_qk, silu_mul, timestep_norm
from .common import interpreting, triton

FLOAT64_PTRS = {"_timestep_norm_kernel": ("stats_in_ptr", "blocks_ptr", "stats_out_ptr")}


def cases() -> list[tuple[Any, dict[str, Any], set[str]]]:
    """(kernel, its GPU config and constexprs, its float32 pointer arguments); pointers named in FLOAT64_PTRS are
    float64, the others bfloat16."""
    return [
        (cema._cema_kernel, {**cema._config(4096, 16), "FINAL": True},
         {"h_in_ptr", "h_out_ptr", "ends_ptr", "p_ptr", "q_ptr", "q_tile_ptr", "q_block_ptr", "gamma_ptr",
          "omega_ptr"}),
        (timestep_norm._timestep_norm_kernel, {**timestep_norm._config(4096, 64), "FINAL": True}, set()),
        (nll._lse_nll_kernel, {"BLOCK_V": nll._block_v(32000), "num_warps": 8}, {"nll_ptr"}),
        (rms_norm._rms_norm_kernel, {"AFFINE": True, "BLOCK_N": 4096, "num_warps": 8}, set()),
        (silu_mul._silu_mul_kernel, {"BLOCK": 2048, "num_warps": 8}, set()),
        (attention._rope_kernel, {"BLOCK_T": 32, "BLOCK_HALF": 128, "num_warps": 4}, {"cos_ptr", "sin_ptr"}),
        (shared_qk._shared_qk_kernel, {"BLOCK_M": 32, "BLOCK_DH": 256, "num_warps": 4}, set()),
        *_decode_step_cases(),
    ]  # fmt: skip


def _decode_step_cases() -> list[tuple[Any, dict[str, Any], dict[str, str]]]:
    """The decoding step's kernels (decode_norm, decode_attention) at 7B shapes (D 4096, 64 norm groups, N 16, 4 heads
    of 256 / 2048, chunk 2048), each with the type of every argument not a bfloat16 pointer nor an int32 (eps: fp32)."""
    fp64, fp32, i64 = "*fp64", "*fp32", "*i64"
    block_k, block_z, block_v = decode_attention._attend_blocks(2048, 256, 2048)
    return [
        (decode_norm._norm_cema_kernel,
         {"FFN": True, "ALPHA": True, "CEMA": True, "BLOCK_D": 64, "BLOCK_N": 16, "num_warps": 4},
         {"c_ptr": fp32, "ss_ptr": fp32, "inv_n_ptr": fp64, "carried_ptr": fp64, "mean_ptr": fp64, "var_ptr": fp64,
          "nw_ptr": fp64, "nb_ptr": fp64, "h_ptr": fp32, "p_ptr": fp32, "q_ptr": fp32, "g_ptr": fp32,
          "omega_ptr": fp32}),
        (decode_norm._rms_kernel, {"AFFINE": True, "BLOCK_G": 64, "BLOCK_D": 1024, "num_warps": 4},
         {"c_ptr": fp32, "ss_ptr": fp32, "w_ptr": fp32}),
        (decode_attention._qk_kernel, {"Z_BIAS": True, "V_BIAS": True, "BLOCK_P": 128, "BLOCK_V": 1024, "num_warps": 4},
         {"scale_ptr": fp32, "offset_ptr": fp32, "rope_ptr": fp32, "fill_ptr": i64, "q_ptr": fp32}),
        (decode_attention._attend_kernel, {"BLOCK_K": block_k, "BLOCK_Z": block_z, "BLOCK_V": block_v, "num_warps": 4},
         {"q_ptr": fp32, "fill_ptr": i64, "o_ptr": fp32, "m_ptr": fp32, "l_ptr": fp32}),
        (decode_attention._attend_combine_kernel,
         {"R_BIAS": True, "BLOCK_K": block_k, "BLOCK_S": 2048 // block_k,
          "BLOCK_V": decode_attention._combine_block(2048 // block_k, 2048), "num_warps": 4},
         {"o_ptr": fp32, "m_ptr": fp32, "l_ptr": fp32, "fill_ptr": i64}),
        (decode_norm._residual_layer_norm_kernel,
         {"H_BIAS": True, "AFFINE": True, "BLOCK_D": 4096, "num_warps": 8}, {}),
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
            elif isinstance(fp32_ptrs, dict) and name in fp32_ptrs:  # a case that types its arguments itself
                signature[name] = fp32_ptrs[name]
            elif name.endswith("_ptr"):
                signature[name] = (
                    "*i64" if name == "t_ptr" else "*fp32" if name in fp32_ptrs
                    else "*fp64" if name in FLOAT64_PTRS.get(fn.fn.__name__, ()) else "*bf16"
                )  # fmt: skip
            else:
                signature[name] = "fp32" if name in ("eps", "inv_sqrt_dh") else "i32"
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
