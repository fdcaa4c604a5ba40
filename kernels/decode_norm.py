"""The decoding step's norms for one token per row (megalodon/decode.py's `StaticDecoder`, overview in decode_step):
the layer's input and its TimestepNorm for one timestep (float64 statistics updated in place), CEMA for one timestep
(float32 state updated in place) and the RMSNorm of the CEMA output; the final norm; the FFN's LayerNorm of x + h.
Each a plain-PyTorch reference (the unfused step's) beside its Triton kernel, with the same arguments and results.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .common import cdiv, check_input, interpreting, jit, next_pow2, tl

# ---------------------------------------------------------------------------------- the buffers


@dataclass
class Norm:
    """One TimestepNorm's statistics [B, G] (float64, updated in place) and affine terms [D] (float64)."""

    mean: Tensor
    var: Tensor
    weight: Tensor  # weight + 1
    bias: Tensor
    eps: float


@dataclass
class Cema:
    """One layer's CEMA state [B, D, N] (complex, updated in place), its coefficients in the accumulation dtype, and
    the RMSNorm of its output."""

    h: Tensor
    p: Tensor  # [D, N] real
    q: Tensor  # [D, N] complex
    gamma: Tensor  # [D, N] complex
    omega: Tensor  # [D]
    rms_weight: Tensor | None  # [D]: weight + 1, or None (no affine)
    rms_eps: float


# ----------------------------------------------------------------------------------- reference


def _layer_input(x: Tensor, ffn: Tensor | None, alpha: Tensor | None) -> Tensor:
    """x, or with the previous layer's FFN output the end of that layer: x + alpha * ffn (`NormalizedFeedForwardNetwork`
    rounds the product, then the sum)."""
    if ffn is None:
        return x
    return (ffn if alpha is None else alpha * ffn) + x


def norm_step(
    x: Tensor, ffn: Tensor | None, alpha: Tensor | None, inv_n: Tensor, carried: Tensor, norm: Norm
) -> tuple[Tensor, Tensor]:
    """TimestepNorm of one timestep of the layer input x [B, D] (with `ffn`: x + alpha ffn), its statistics updated
    in place (`cumulative_moments` at T = 1: mean += d / n, var = (c var + step_var + d^2 c / n) / n, with
    d = step_mean - mean, n = c + 1). inv_n, carried [B, 1]: 1 / n and c / n. Returns the input and y [B, D] (the
    input's dtype)."""
    x = _layer_input(x, ffn, alpha)
    B, G = norm.mean.shape
    xg = x.view(B, G, -1).double()
    step_var, step_mean = torch.var_mean(xg, dim=-1, correction=0)
    d = step_mean - norm.mean
    # var + (step_var + d^2 c / n - var) / n: the same variance; lerp of two non-negative ends stays >= 0
    norm.var.lerp_(torch.addcmul(step_var, d * carried, d), inv_n)
    norm.mean.lerp_(step_mean, inv_n)
    y = (xg - norm.mean[..., None]) * torch.rsqrt(norm.var + norm.eps)[..., None]
    return x, torch.addcmul(norm.bias, y.view(B, -1), norm.weight, out=torch.empty_like(x))  # rounded to x.dtype


def norm_cema_step(
    x: Tensor, ffn: Tensor | None, alpha: Tensor | None, inv_n: Tensor, carried: Tensor, norm: Norm, cema: Cema
) -> tuple[Tensor, Tensor, Tensor]:
    """`norm_step`, then CEMA of y for one timestep, its state updated in place (h = p y + q h, out = Re(sum gamma h)
    + omega y, in the accumulation dtype), then the RMSNorm of out. Returns the input, y and mx (x's dtype)."""
    x, y = norm_step(x, ffn, alpha, inv_n, carried, norm)
    torch.view_as_real(cema.h.mul_(cema.q))[..., 0].addcmul_(cema.p, y[..., None])
    out = torch.addcmul((cema.h * cema.gamma).sum(-1).real, cema.omega, y)
    return x, y, F.rms_norm(out, (out.shape[-1],), cema.rms_weight, cema.rms_eps).to(x.dtype)


def residual_layer_norm(
    x: Tensor, h: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, h_bias: Tensor | None = None
) -> Tensor:
    """LayerNorm(x + h) over the last dimension (h plus h_bias), times (weight + 1) plus bias when affine (the model's
    LayerNorm)."""
    s = x + (h if h_bias is None else h + h_bias)
    return F.layer_norm(s, s.shape[-1:], None if weight is None else weight + 1.0, bias, eps)


# -------------------------------------------------------------------------------------- Triton


@jit
def _input_tile(x_ptr, f_ptr, a_ptr, row, d, mask, FFN: tl.constexpr, ALPHA: tl.constexpr):
    """The layer input at dims d of a row: x, or with FFN x + alpha ffn, rounded as the model rounds it (the product,
    then the sum), in the model dtype."""
    x = tl.load(x_ptr + row + d, mask=mask, other=0.0)
    if FFN:
        f = tl.load(f_ptr + row + d, mask=mask, other=0.0).to(tl.float32)
        if ALPHA:
            f = (tl.load(a_ptr + d, mask=mask, other=0.0).to(tl.float32) * f).to(x.dtype).to(tl.float32)
        x = (f + x.to(tl.float32)).to(x.dtype)
    return x


@jit
def _norm_cema_kernel(
    x_ptr, f_ptr, a_ptr, xo_ptr, y_ptr, c_ptr, ss_ptr,
    inv_n_ptr, carried_ptr, mean_ptr, var_ptr, nw_ptr, nb_ptr,
    h_ptr, p_ptr, q_ptr, g_ptr, omega_ptr,
    D, G, GS, N, eps,
    FFN: tl.constexpr, ALPHA: tl.constexpr, CEMA: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One program: row b, norm group g (GS dimensions, in tiles of BLOCK_D), two passes over the group's input.
    The first takes its moments around the carried mean m (float64: the sums lose nothing to the mean's size), the
    statistics step (torch.lerp's formulas, as the reference), the second writes y; with CEMA each tile of y steps
    its CEMA state (float32 (real, imaginary) pairs) and stores the CEMA output (float32), and the program the
    group's sum of its squares."""
    b = tl.program_id(0).to(tl.int64)  # offsets of the CEMA state can pass 2**31 elements
    g = tl.program_id(1)
    row = b * D
    d0 = g * GS
    stat = b * G + g
    mean = tl.load(mean_ptr + stat)
    var = tl.load(var_ptr + stat)
    s1 = tl.zeros([BLOCK_D], dtype=tl.float64)
    s2 = tl.zeros([BLOCK_D], dtype=tl.float64)
    for s0 in range(0, GS, BLOCK_D):
        e = s0 + tl.arange(0, BLOCK_D)
        mask = e < GS
        d = d0 + e
        x = _input_tile(x_ptr, f_ptr, a_ptr, row, d, mask, FFN, ALPHA)
        if FFN:
            tl.store(xo_ptr + row + d, x, mask=mask)
        r = tl.where(mask, x.to(tl.float64) - mean, 0.0)
        s1 += r
        s2 += r * r
    dm = tl.sum(s1, axis=0) / GS  # step_mean - mean
    step_var = tl.maximum(tl.sum(s2, axis=0) / GS - dm * dm, 0.0)
    inv_n = tl.load(inv_n_ptr + b)
    carried = tl.load(carried_ptr + b)
    # torch.lerp(a, b, w): a + w (b - a) below w = 0.5, b - (b - a)(1 - w) from there
    target = step_var + dm * carried * dm
    var = tl.where(inv_n < 0.5, var + inv_n * (target - var), target - (target - var) * (1.0 - inv_n))
    step_mean = mean + dm
    mean = tl.where(inv_n < 0.5, mean + inv_n * dm, step_mean - dm * (1.0 - inv_n))
    tl.store(mean_ptr + stat, mean)
    tl.store(var_ptr + stat, var)
    rstd = 1.0 / tl.sqrt(var + eps)

    squares = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, GS, BLOCK_D):
        e = s0 + tl.arange(0, BLOCK_D)
        mask = e < GS
        d = d0 + e
        x = _input_tile(x_ptr, f_ptr, a_ptr, row, d, mask, FFN, ALPHA)  # again: a program does not read its stores
        w = tl.load(nw_ptr + d, mask=mask, other=0.0)
        bias = tl.load(nb_ptr + d, mask=mask, other=0.0)
        y = bias + (x.to(tl.float64) - mean) * rstd * w
        y = y.to(tl.float32).to(y_ptr.dtype.element_ty)  # rounded to the model dtype: what the projections read
        tl.store(y_ptr + row + d, y, mask=mask)
        if CEMA:
            yc = y.to(tl.float32)
            n = tl.arange(0, BLOCK_N)
            dn = d[:, None] * N + n[None, :]
            dn_mask = mask[:, None] & (n < N)[None, :]
            hp = h_ptr + 2 * (row * N + dn)
            h_re = tl.load(hp, mask=dn_mask, other=0.0)
            h_im = tl.load(hp + 1, mask=dn_mask, other=0.0)
            q_re = tl.load(q_ptr + 2 * dn, mask=dn_mask, other=0.0)
            q_im = tl.load(q_ptr + 2 * dn + 1, mask=dn_mask, other=0.0)
            p = tl.load(p_ptr + dn, mask=dn_mask, other=0.0)
            new_re = (h_re * q_re - h_im * q_im) + p * yc[:, None]
            new_im = h_re * q_im + h_im * q_re
            tl.store(hp, new_re, mask=dn_mask)
            tl.store(hp + 1, new_im, mask=dn_mask)
            g_re = tl.load(g_ptr + 2 * dn, mask=dn_mask, other=0.0)
            g_im = tl.load(g_ptr + 2 * dn + 1, mask=dn_mask, other=0.0)
            omega = tl.load(omega_ptr + d, mask=mask, other=0.0)
            out = tl.sum(new_re * g_re - new_im * g_im, axis=1) + omega * yc
            out = tl.where(mask, out, 0.0)
            tl.store(c_ptr + row + d, out, mask=mask)
            squares += out * out
    if CEMA:
        tl.store(ss_ptr + stat, tl.sum(squares, axis=0))


@jit
def _rms_kernel(c_ptr, ss_ptr, w_ptr, mx_ptr, D, G, eps, AFFINE: tl.constexpr, BLOCK_G: tl.constexpr,
                BLOCK_D: tl.constexpr):  # fmt: skip
    """One program: BLOCK_D dimensions of row b's CEMA output, scaled by the row's 1 / rms (from the groups' sums
    of squares) and the RMSNorm weight, rounded to the model dtype."""
    b = tl.program_id(0).to(tl.int64)
    gi = tl.arange(0, BLOCK_G)
    total = tl.sum(tl.load(ss_ptr + b * G + gi, mask=gi < G, other=0.0), axis=0)
    scale = 1.0 / tl.sqrt(total / D + eps)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = d < D
    y = tl.load(c_ptr + b * D + d, mask=mask, other=0.0) * scale
    if AFFINE:
        y = y * tl.load(w_ptr + d, mask=mask, other=0.0)
    tl.store(mx_ptr + b * D + d, y.to(mx_ptr.dtype.element_ty), mask=mask)


def _norm_cema_launch(
    x: Tensor, ffn: Tensor | None, alpha: Tensor | None, inv_n: Tensor, carried: Tensor, norm: Norm,
    cema: Cema | None,
) -> tuple[Tensor, Tensor, Tensor | None]:  # fmt: skip
    check_input("x", x)
    B, D = x.shape
    G = norm.mean.shape[1]
    GS = D // G
    x = x.contiguous()
    y = torch.empty_like(x)
    xo = x if ffn is None else torch.empty_like(x)
    f = x if ffn is None else ffn.contiguous()
    a = x if alpha is None else alpha
    if cema is None:
        N, block_n = 1, 1
        c = ss = h = p = q = g = omega = y  # not read
    else:
        N = cema.p.shape[1]
        block_n = next_pow2(N)
        c = torch.empty(B, D, dtype=torch.float32, device=x.device)
        ss = torch.empty(B, G, dtype=torch.float32, device=x.device)
        h, q, g = (torch.view_as_real(t) for t in (cema.h, cema.q, cema.gamma))
        p, omega = cema.p, cema.omega
        if not all(t.dtype == torch.float32 and t.is_contiguous() for t in (h, q, g, p, omega)):
            raise ValueError("the fused step keeps its CEMA state and coefficients in contiguous float32")
    block_d = min(next_pow2(GS), 4 if interpreting() else max(16, 2048 // block_n))
    if B:
        _norm_cema_kernel[(B, G)](
            x, f, a, xo, y, c, ss, inv_n, carried, norm.mean, norm.var, norm.weight, norm.bias,
            h, p, q, g, omega, D, G, GS, N, norm.eps,
            FFN=ffn is not None, ALPHA=alpha is not None, CEMA=cema is not None, BLOCK_D=block_d, BLOCK_N=block_n,
            num_warps=4,
        )  # fmt: skip
    if cema is None:
        return xo, y, None
    mx = torch.empty_like(x)
    block = min(next_pow2(D), 8 if interpreting() else 1024)
    if B:
        w = cema.rms_weight
        _rms_kernel[(B, cdiv(D, block))](
            c, ss, c if w is None else w, mx, D, G, cema.rms_eps,
            AFFINE=w is not None, BLOCK_G=next_pow2(G), BLOCK_D=block, num_warps=4,
        )  # fmt: skip
    return xo, y, mx


def norm_step_triton(
    x: Tensor, ffn: Tensor | None, alpha: Tensor | None, inv_n: Tensor, carried: Tensor, norm: Norm
) -> tuple[Tensor, Tensor]:
    """`norm_step` by one Triton kernel; same arguments and results."""
    x, y, _ = _norm_cema_launch(x, ffn, alpha, inv_n, carried, norm, None)
    return x, y


def norm_cema_step_triton(
    x: Tensor, ffn: Tensor | None, alpha: Tensor | None, inv_n: Tensor, carried: Tensor, norm: Norm, cema: Cema
) -> tuple[Tensor, Tensor, Tensor]:
    """`norm_cema_step` by two Triton kernels (norm and CEMA by norm group; then the RMSNorm, which needs the sum
    over the whole row); same arguments and results."""
    return _norm_cema_launch(x, ffn, alpha, inv_n, carried, norm, cema)  # type: ignore[return-value]


@jit
def _residual_tile(x_ptr, h_ptr, hb_ptr, offs, d, mask, H_BIAS: tl.constexpr):
    """x + h (h plus its bias) at `offs` (dims d), rounded as the reference rounds them, in float32."""
    h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if H_BIAS:
        h = (h + tl.load(hb_ptr + d, mask=mask, other=0.0).to(tl.float32)).to(x_ptr.dtype.element_ty).to(tl.float32)
    s = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) + h
    return s.to(x_ptr.dtype.element_ty).to(tl.float32)


@jit
def _residual_layer_norm_kernel(
    x_ptr, h_ptr, hb_ptr, w_ptr, b_ptr, y_ptr, D, eps,
    H_BIAS: tl.constexpr, AFFINE: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One program: row b, in tiles of BLOCK_D, three passes (mean, variance around it, output): x + h rounded to
    the model dtype, then LayerNorm in float32, its weight + 1 rounded to the model dtype as the model's is."""
    row = tl.program_id(0).to(tl.int64) * D
    total = tl.zeros([BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        total += _residual_tile(x_ptr, h_ptr, hb_ptr, row + d, d, d < D, H_BIAS)
    mean = tl.sum(total, axis=0) / D
    total = tl.zeros([BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dev = tl.where(d < D, _residual_tile(x_ptr, h_ptr, hb_ptr, row + d, d, d < D, H_BIAS) - mean, 0.0)
        total += dev * dev
    rstd = 1.0 / tl.sqrt(tl.sum(total, axis=0) / D + eps)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = d < D
        y = (_residual_tile(x_ptr, h_ptr, hb_ptr, row + d, d, mask, H_BIAS) - mean) * rstd
        if AFFINE:
            w = (tl.load(w_ptr + d, mask=mask, other=0.0).to(tl.float32) + 1.0).to(y_ptr.dtype.element_ty)
            y = y * w.to(tl.float32) + tl.load(b_ptr + d, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row + d, y.to(y_ptr.dtype.element_ty), mask=mask)


def residual_layer_norm_triton(
    x: Tensor, h: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, h_bias: Tensor | None = None
) -> Tensor:
    """`residual_layer_norm` by one Triton kernel for rows [B, D]; same arguments and results."""
    check_input("x", x)
    if (weight is None) != (bias is None):
        raise ValueError("residual_layer_norm_triton takes both affine terms or neither")
    B, D = x.shape
    y = torch.empty_like(x)
    if B:
        _residual_layer_norm_kernel[(B,)](
            x.contiguous(), h.contiguous(), x if h_bias is None else h_bias, x if weight is None else weight,
            x if bias is None else bias, y, D, eps,
            H_BIAS=h_bias is not None, AFFINE=weight is not None,
            BLOCK_D=min(next_pow2(D), 8 if interpreting() else 4096), num_warps=4 if D <= 2048 else 8,
        )  # fmt: skip
    return y
