"""CEMA, MEGALODON's complex exponential moving average, over a call of T tokens with its state carried.

Per dimension d and component n:  h_t = p x_t + q h_{t-1},  y_t = Re(sum_n gamma_n h_t,n) + omega x_t.
The reference convolves by FFT; the Triton kernel runs the recurrence in float32 with the complex
numbers as (real, imaginary) pairs.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import Tensor

from .common import acc_dtype, available, cdiv, check_input, interpreting, jit, next_pow2, tl, triton

# ----------------------------------------------------------------------------------- reference


def complex_powers(log_q: Tensor, length: int, dtype: torch.dtype) -> Tensor:
    """q**t for t in [0, length) as [..., length] of `dtype`.

    Written q**(b*K + j) = (q**K)**b * q**j with both factors from float64 exponents, so the
    phase stays accurate for long calls even when the result is complex64.
    """
    K = math.isqrt(max(length - 1, 0)) + 1
    j = torch.arange(K, dtype=torch.float64, device=log_q.device)
    small = torch.exp(log_q[..., None] * j).to(dtype)
    large = torch.exp(log_q[..., None] * (j * K)).to(dtype)
    return (large[..., :, None] * small[..., None, :]).flatten(-2)[..., :length]


def causal_fft_conv(x: Tensor, kernel: Tensor) -> Tensor:
    """y[..., t] = sum_{s<=t} kernel[..., t-s] x[..., s], by FFT. x: [B, D, T], kernel: [D, T]."""
    T = x.shape[-1]
    n = 1 << (2 * T - 1).bit_length()
    y = torch.fft.irfft(torch.fft.rfft(x, n=n) * torch.fft.rfft(kernel, n=n), n=n)
    return y[..., :T]


def cema(x: Tensor, h: Tensor, p: Tensor, log_q: Tensor, gamma: Tensor, omega: Tensor) -> tuple[Tensor, Tensor]:
    """Reference CEMA. x: [B, T, D]; h: [B, D, N] complex carried state; p [D, N] real, log q and
    gamma [D, N] complex (float64); omega [D, 1]. Returns y [B, T, D] and the new state."""
    T = x.shape[1]
    cdt, rdt = h.dtype, acc_dtype(x.dtype)
    q_pow = complex_powers(log_q, T + 1, cdt)  # [D, N, T+1]
    xt = x.to(rdt).transpose(1, 2)  # [B, D, T]
    kernel = ((p * gamma).to(cdt)[..., None] * q_pow[..., :T]).real.sum(1)  # [D, T]
    y = causal_fft_conv(xt, kernel)
    y = y + torch.einsum("bdn,dnt->bdt", h * gamma.to(cdt), q_pow[..., 1:]).real  # carried state
    y = y + omega.to(rdt) * xt
    reversed_pow = q_pow[..., :T].flip(-1)  # q**(T-1-s)
    injected = torch.complex(
        torch.einsum("bds,dns->bdn", xt, reversed_pow.real), torch.einsum("bds,dns->bdn", xt, reversed_pow.imag)
    )
    h = p.to(cdt) * injected + q_pow[..., T] * h
    return y.transpose(1, 2).to(x.dtype), h


# -------------------------------------------------------------------------------------- Triton

BLOCK_T = 16  # timesteps per tile; the state re-anchors once per tile


@jit
def _output_tile(
    x_row, y_row, t0, t_end, sxt, D, d_mask, h_re, h_im, p, q_re, q_im, qt_re, qt_im, c_re, c_im, omega,
    MASKED: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """One tile of up to BLOCK_T steps from state h_start = h: writes y, returns the state after the tile. Only the
    call's last tile, which may be partial, takes masks (MASKED)."""
    a_re, a_im = h_re, h_im  # q**(j+1) h_start
    l_re = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)  # loc
    l_im = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(BLOCK_T):
        if MASKED:
            in_call = (t0 + j + tl.zeros_like(omega).to(tl.int32)) < t_end  # a tensor: the interpreter rejects bools
            t_mask = d_mask & in_call
        else:
            t_mask = d_mask
        xj = tl.load(x_row + (t0 + j) * sxt, mask=t_mask, other=0.0).to(tl.float32)
        na_re = q_re * a_re - q_im * a_im
        na_im = q_re * a_im + q_im * a_re
        nl_re = q_re * l_re - q_im * l_im + p * xj[:, None]
        nl_im = q_re * l_im + q_im * l_re
        if MASKED:
            valid = in_call[:, None]
            na_re = tl.where(valid, na_re, a_re)
            na_im = tl.where(valid, na_im, a_im)
            nl_re = tl.where(valid, nl_re, l_re)
            nl_im = tl.where(valid, nl_im, l_im)
        a_re, a_im, l_re, l_im = na_re, na_im, nl_re, nl_im
        yj = tl.sum(c_re * (l_re + a_re) - c_im * (l_im + a_im), axis=1) + omega * xj
        tl.store(y_row + (t0 + j) * D, yj.to(y_row.dtype.element_ty), mask=t_mask)
    if MASKED:  # a partial tile ends the call: its state is the stepped one
        return a_re + l_re, a_im + l_im
    return qt_re * h_re - qt_im * h_im + l_re, qt_re * h_im + qt_im * h_re + l_im


@jit(do_not_specialize=["T", "L", "K", "sxb"])  # lengths vary from call to call: one build serves them all
def _cema_kernel(
    x_ptr, y_ptr, h_in_ptr, h_out_ptr, ends_ptr, p_ptr, q_ptr, q_tile_ptr, q_block_ptr, gamma_ptr, omega_ptr,
    T, D, N, L, K,
    sxb, sxt, sxd,
    FINAL: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """One program: batch row b, BLOCK_D dimensions, every component, the L timesteps of block k in order.

    A call is cut into K blocks of L steps (a multiple of BLOCK_T), run in parallel in two launches. The first
    (FINAL false) runs every block but the last from a zero state and stores only its end state in `ends`.
    The second (FINAL true) starts block k from h_start = q**L h_start(k-1) + ends[k-1] (h_start(0) is the
    carried state), writes y, and its last block writes the state after the call.

    In each tile of BLOCK_T steps, h_t = q**(j+1) h_start + loc_j, where loc starts from zero. At the end of a
    full tile the state is q_tile * h_start + loc, with q_tile = q**BLOCK_T rounded once from float64, so
    float32 rounding of q compounds over one tile only; block starts likewise use q**L rounded once.
    """
    b = tl.program_id(0).to(tl.int64)  # batch offsets can pass 2**31 elements
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    k = tl.program_id(2)
    n = tl.arange(0, BLOCK_N)
    d_mask = d < D
    dn_mask = d_mask[:, None] & (n < N)[None, :]
    dn = d[:, None] * N + n[None, :]
    p = tl.load(p_ptr + dn, mask=dn_mask, other=0.0)
    q_re = tl.load(q_ptr + 2 * dn, mask=dn_mask, other=0.0)
    q_im = tl.load(q_ptr + 2 * dn + 1, mask=dn_mask, other=0.0)
    qt_re = tl.load(q_tile_ptr + 2 * dn, mask=dn_mask, other=0.0)
    qt_im = tl.load(q_tile_ptr + 2 * dn + 1, mask=dn_mask, other=0.0)
    c_re = tl.load(gamma_ptr + 2 * dn, mask=dn_mask, other=0.0)
    c_im = tl.load(gamma_ptr + 2 * dn + 1, mask=dn_mask, other=0.0)
    omega = tl.load(omega_ptr + d, mask=d_mask, other=0.0)
    h_offsets = b * D * N * 2 + 2 * dn
    ends_row = ends_ptr + b * K * D * N * 2 + 2 * dn  # ends[b, j] at + j * D * N * 2
    h_re = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    h_im = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
    if FINAL:
        h_re = tl.load(h_in_ptr + h_offsets, mask=dn_mask, other=0.0)
        h_im = tl.load(h_in_ptr + h_offsets + 1, mask=dn_mask, other=0.0)
        qb_re = tl.load(q_block_ptr + 2 * dn, mask=dn_mask, other=0.0)
        qb_im = tl.load(q_block_ptr + 2 * dn + 1, mask=dn_mask, other=0.0)
        for i in range(0, k):  # the state entering block k, from the end states of the blocks before it
            e_re = tl.load(ends_row + i * D * N * 2, mask=dn_mask, other=0.0)
            e_im = tl.load(ends_row + i * D * N * 2 + 1, mask=dn_mask, other=0.0)
            s_re = qb_re * h_re - qb_im * h_im + e_re
            h_im = qb_re * h_im + qb_im * h_re + e_im
            h_re = s_re
    x_row = x_ptr + b * sxb + d * sxd
    y_row = y_ptr + b * T * D + d
    t_start = k * L
    t_end = tl.minimum(t_start + L, T)
    if FINAL:  # whole tiles without masks, then the call's last partial tile, if any, with them
        t_full = t_start + (t_end - t_start) // BLOCK_T * BLOCK_T
        for t0 in range(t_start, t_full, BLOCK_T):
            h_re, h_im = _output_tile(
                x_row, y_row, t0, t_end, sxt, D, d_mask, h_re, h_im, p, q_re, q_im, qt_re, qt_im, c_re, c_im, omega,
                False, BLOCK_D, BLOCK_N, BLOCK_T,
            )  # fmt: skip
        if t_full < t_end:
            h_re, h_im = _output_tile(
                x_row, y_row, t_full, t_end, sxt, D, d_mask, h_re, h_im, p, q_re, q_im, qt_re, qt_im, c_re, c_im,
                omega, True, BLOCK_D, BLOCK_N, BLOCK_T,
            )  # fmt: skip
    else:  # blocks but the last: every tile whole, only the local sums matter
        for t0 in range(t_start, t_end, BLOCK_T):
            l_re = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
            l_im = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)
            for j in tl.static_range(BLOCK_T):
                xj = tl.load(x_row + (t0 + j) * sxt, mask=d_mask, other=0.0).to(tl.float32)
                nl_re = q_re * l_re - q_im * l_im + p * xj[:, None]
                l_im = q_re * l_im + q_im * l_re
                l_re = nl_re
            s_re = qt_re * h_re - qt_im * h_im + l_re
            h_im = qt_re * h_im + qt_im * h_re + l_im
            h_re = s_re
    if FINAL:
        last = dn_mask & ((k + tl.zeros_like(dn)) == K - 1)  # a tensor, for the interpreter
        tl.store(h_out_ptr + h_offsets, h_re, mask=last)
        tl.store(h_out_ptr + h_offsets + 1, h_im, mask=last)
    else:
        tl.store(ends_row + k * D * N * 2, h_re, mask=dn_mask)
        tl.store(ends_row + k * D * N * 2 + 1, h_im, mask=dn_mask)


def _pairs(z: Tensor) -> Tensor:
    """Complex float64 -> contiguous float32 (real, imaginary) pairs, rounded once."""
    return torch.view_as_real(z.to(torch.complex64)).contiguous()


def _config(D: int, N: int) -> dict[str, int]:
    """Block sizes under the interpreter, which is fastest with few programs (still two of them whenever D > 4),
    and for ahead-of-time builds; on a GPU `_TUNED` picks among `_GPU_CONFIGS`."""
    block_n = next_pow2(N)
    block_d = max(4, next_pow2(D) // 2) if interpreting() else max(1, 128 // block_n)
    return dict(BLOCK_D=block_d, BLOCK_N=block_n, BLOCK_T=BLOCK_T, num_warps=4)


# (BLOCK_D, num_warps) tried once per shape on a GPU: from one (d, n) element per thread to eight
_GPU_CONFIGS = ((8, 4), (8, 2), (16, 4), (16, 2), (32, 4), (32, 2), (64, 4), (64, 8))


_TUNED_CONFIGS = [triton.Config({"BLOCK_D": bd}, num_warps=w) for bd, w in _GPU_CONFIGS] if available() else []
_TUNED = triton.autotune(_TUNED_CONFIGS, key=["D", "N", "L", "FINAL"])(_cema_kernel) if available() else None


def block_len(T: int) -> int:
    """Timesteps per parallel block: at most 16 blocks a call, at least 128 steps each (32 under the interpreter,
    so that tests cross block boundaries); a multiple of BLOCK_T."""
    if interpreting():
        return 2 * BLOCK_T
    return max(128, next_pow2(cdiv(T, 16)))


_CONSTANTS: OrderedDict[tuple, tuple[Tensor, ...]] = OrderedDict()  # kernel constants of recent coefficients
_CONSTANTS_KEPT = 128  # two block lengths for each layer of a deep model


def kernel_constants(p: Tensor, log_q: Tensor, gamma: Tensor, omega: Tensor, L: int) -> tuple[Tensor, ...]:
    """p, q, q**BLOCK_T, q**L, gamma (complex ones as float32 pairs, rounded once from float64) and omega, as the
    kernel reads them; kept for coefficients seen recently (a model's are the same tensors call after call:
    `MultiHeadComplexEMA.coefficients`), each entry holding its tensors so that their memory is not reused."""
    key = tuple((t.data_ptr(), 0 if t.is_inference() else t._version) for t in (p, log_q, gamma, omega)) + (L,)
    hit = _CONSTANTS.get(key)
    if hit is not None:
        _CONSTANTS.move_to_end(key)
        return hit[4:]
    out = (
        p.to(torch.float32).contiguous(), _pairs(torch.exp(log_q)), _pairs(torch.exp(log_q * BLOCK_T)),
        _pairs(torch.exp(log_q * L)), _pairs(gamma), omega.reshape(-1).to(torch.float32).contiguous(),
    )  # fmt: skip
    _CONSTANTS[key] = (p, log_q, gamma, omega, *out)
    while len(_CONSTANTS) > _CONSTANTS_KEPT:
        _CONSTANTS.popitem(last=False)
    return out


def cema_triton(x: Tensor, h: Tensor, p: Tensor, log_q: Tensor, gamma: Tensor, omega: Tensor) -> tuple[Tensor, Tensor]:
    """CEMA by the Triton kernel; same arguments and results as `cema`."""
    check_input("x", x)
    B, T, D = x.shape
    N = p.shape[1]
    if T == 0:
        return x.clone(), h.clone()
    L = block_len(T)
    blocks = cdiv(T, L)
    y = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    h_in = torch.view_as_real(h.to(torch.complex64)).contiguous()
    h_out = torch.empty_like(h_in)
    ends = torch.empty(B, blocks, D, N, 2, dtype=torch.float32, device=x.device)
    args = (x, y, h_in, h_out, ends, *kernel_constants(p, log_q, gamma, omega, L), T, D, N, L, blocks, *x.stride())
    for final, programs in ((False, blocks - 1), (True, blocks)):  # end states of blocks but the last; then all
        if programs == 0:
            continue
        if interpreting():
            cfg = _config(D, N)
            _cema_kernel[(B, cdiv(D, cfg["BLOCK_D"]), programs)](*args, FINAL=final, **cfg)
        else:
            grid = lambda meta, n=programs: (B, cdiv(D, meta["BLOCK_D"]), n)  # noqa: E731
            _TUNED[grid](*args, FINAL=final, BLOCK_N=next_pow2(N), BLOCK_T=BLOCK_T)
    return y, torch.view_as_complex(h_out).to(h.dtype)
