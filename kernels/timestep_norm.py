"""TimestepNorm: group norm whose statistics are cumulative over time, carried from call to call.

Each group is normalised by the mean and (population) variance of every timestep so far, the current
one included, each timestep an equally weighted sample of the group. The carried statistics are
(count, mean [B, G], var [B, G]), the last two in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import acc_dtype, cdiv, check_input, interpreting, jit, next_pow2, tl

# ----------------------------------------------------------------------------------- reference


def cumulative_moments(
    step_mean: Tensor, step_var: Tensor, count: int, mean: Tensor, var: Tensor
) -> tuple[Tensor, Tensor]:
    """Running mean/variance after each timestep, each timestep one equally weighted group sample.

    step_mean, step_var: [B, T, G] float64 moments of each timestep's group; count, mean, var: the
    carried statistics. Returns the pooled mean and (population) variance over the carried statistics
    and timesteps 1..t, for every t. Sums are taken around the carried mean so that float64 keeps
    them exact over long streams.
    """
    T = step_mean.shape[1]
    n = count + torch.arange(1, T + 1, dtype=torch.float64, device=step_mean.device)[:, None]
    d = step_mean - mean[:, None]
    s1 = d.cumsum(1)
    s2 = (step_var + d * d).cumsum(1)
    mean_t = mean[:, None] + s1 / n
    var_t = ((count * var[:, None] + s2) / n - (s1 / n) ** 2).clamp_min(0)
    return mean_t, var_t


def timestep_norm(
    x: Tensor, weight: Tensor, bias: Tensor, count: int, mean: Tensor, var: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Reference TimestepNorm of x [B, T, D] (T >= 1) after `count` timesteps with statistics mean, var
    [B, G] (float64). Returns y [B, T, D] and the mean and variance after the last timestep."""
    B, T, D = x.shape
    G = mean.shape[1]
    acc = acc_dtype(x.dtype)
    xg = x.view(B, T, G, D // G)
    step_var, step_mean = torch.var_mean(xg.double(), dim=-1, correction=0)  # exact for any input dtype
    mean_t, var_t = cumulative_moments(step_mean, step_var, count, mean, var)
    rstd = torch.rsqrt(var_t + eps).to(acc)
    y = ((xg.to(acc) - mean_t.to(acc)[..., None]) * rstd[..., None]).view(B, T, D)
    y = y * (weight.to(acc) + 1.0) + bias.to(acc)
    return y.to(x.dtype), mean_t[:, -1], var_t[:, -1]


# -------------------------------------------------------------------------------------- Triton


@jit(do_not_specialize=["count", "T", "L", "K", "sxb"])  # one build for every length and position
def _timestep_norm_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, stats_in_ptr, blocks_ptr, stats_out_ptr,
    count, B, T, G, GS, L, K, eps,
    sxb, sxt, sxd,
    FINAL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """One program: batch row b, group g, the timesteps [k L, (k + 1) L) of block k, in tiles of BLOCK_T.

    A call is cut into K blocks of L timesteps, run in parallel in two launches. The first (FINAL false) takes
    each block but the last from a fresh state and stores only its statistics (float64 mean and variance,
    blocks [2, B, K - 1, G]). The second (FINAL true) starts block k from the carried statistics (float64
    [2, B, G], after `count` timesteps) pooled with those of the blocks before it, writes y, and its last block
    writes the statistics after the call (float64 [2, B, G]).

    The carried mean and variance are float32 (hi, lo) pairs, updated once per tile by compensated
    (two-sum) additions of small increments. Inside a tile every moment is taken around the carried
    mean, so float32 loses nothing to the mean's magnitude, and the prefix sums over the tile give
    each timestep's statistics in parallel:
        a_s = step_mean_s - m,  E_t = sum_{s<=t} (step_var_s + a_s**2 - v),  S_t = sum_{s<=t} a_s
        mean_t = m + S_t / n_t,  var_t = v + E_t / n_t - (S_t / n_t)**2      (n_t = count so far)
    """
    b = tl.program_id(0).to(tl.int64)  # batch offsets can pass 2**31 elements
    g = tl.program_id(1)
    k = tl.program_id(2)
    e = tl.arange(0, BLOCK_S)
    e_mask = e < GS
    d = g * GS + e
    w1 = tl.load(w_ptr + d, mask=e_mask, other=0.0).to(tl.float32) + 1.0
    bias = tl.load(b_ptr + d, mask=e_mask, other=0.0).to(tl.float32)
    stat = b * G + g  # in [B, G]
    t_start = k * L
    t_end = tl.minimum(t_start + L, T)
    x_base = x_ptr + b * sxb + d * sxd
    y_base = y_ptr + b * T * G * GS + d
    if FINAL:
        # the statistics entering block k: the carried ones, then blocks 0..k-1 pooled in (Chan et al.), float64
        n = count.to(tl.float64)
        mean = tl.load(stats_in_ptr + stat)
        var = tl.load(stats_in_ptr + B * G + stat)
        for i in range(0, k):
            block = (b * (K - 1) + i) * G + g
            block_mean = tl.load(blocks_ptr + block)
            block_var = tl.load(blocks_ptr + B * (K - 1) * G + block)
            n_new = n + L
            delta = block_mean - mean
            mean = mean + delta * (L / n_new)
            var = (n * var + L * block_var) / n_new + delta * delta * (n * L / (n_new * n_new))
            n = n_new
        m_hi = mean.to(tl.float32)
        m_lo = (mean - m_hi.to(tl.float64)).to(tl.float32)
        v_hi = var.to(tl.float32)
        v_lo = (var - v_hi.to(tl.float64)).to(tl.float32)
        before = count + k * L
    else:
        m_hi = tl.zeros([], tl.float32)
        m_lo = tl.zeros([], tl.float32)
        v_hi = tl.zeros([], tl.float32)
        v_lo = tl.zeros([], tl.float32)
        before = k * 0
    # A fresh state (count 0) carries no weight: centre on the block's first timestep's mean instead.
    fresh = (before + tl.zeros([], tl.int32)) == 0
    first = tl.sum(tl.load(x_base + t_start * sxt, mask=e_mask, other=0.0).to(tl.float32), axis=0) / GS
    m_hi = tl.where(fresh, first, m_hi)
    m_lo = tl.where(fresh, 0.0, m_lo)
    v_hi = tl.where(fresh, 0.0, v_hi)
    v_lo = tl.where(fresh, 0.0, v_lo)
    c = before.to(tl.float32)
    for t0 in range(t_start, t_end, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        t_mask = t < t_end
        mask = t_mask[:, None] & e_mask[None, :]
        x = tl.load(x_base[None, :] + t[:, None] * sxt, mask=mask, other=0.0).to(tl.float32)
        r = tl.where(mask, x - m_hi, 0.0)  # exact (Sterbenz) when x is near the mean
        a = tl.where(t_mask, tl.sum(r, axis=1) / GS - m_lo, 0.0)
        dev = tl.where(mask, r - m_lo - a[:, None], 0.0)
        step_var = tl.sum(dev * dev, axis=1) / GS
        e_t = tl.where(t_mask, (step_var - v_hi) + a * a - v_lo, 0.0)
        if FINAL:
            n_t = c + (t - t_start + 1).to(tl.float32)
            mu = tl.cumsum(a, axis=0) / n_t
            var_t = v_hi + (v_lo + tl.cumsum(e_t, axis=0) / n_t - mu * mu)
            rstd = 1.0 / tl.sqrt(tl.maximum(var_t, 0.0) + eps)
            y = (r - (m_lo + mu)[:, None]) * rstd[:, None] * w1[None, :] + bias[None, :]
            tl.store(y_base[None, :] + t[:, None] * (G * GS), y.to(y_ptr.dtype.element_ty), mask=mask)

        n_end = c + (tl.minimum(t0 + BLOCK_T, t_end) - t_start).to(tl.float32)
        mu_end = tl.sum(a, axis=0) / n_end
        dv = tl.sum(e_t, axis=0) / n_end - mu_end * mu_end
        # (hi, lo) += increment: two-sum, then renormalise so that |lo| stays below an ulp of hi
        s = m_hi + mu_end
        z = s - m_hi
        m_lo = m_lo + ((m_hi - (s - z)) + (mu_end - z))
        m_hi = s + m_lo
        m_lo = m_lo - (m_hi - s)
        s = v_hi + dv
        z = s - v_hi
        v_lo = v_lo + ((v_hi - (s - z)) + (dv - z))
        v_hi = s + v_lo
        v_lo = v_lo - (v_hi - s)
    mean_out = m_hi.to(tl.float64) + m_lo.to(tl.float64)
    var_out = tl.maximum(v_hi.to(tl.float64) + v_lo.to(tl.float64), 0.0)
    if FINAL:
        if k == K - 1:
            tl.store(stats_out_ptr + stat, mean_out)
            tl.store(stats_out_ptr + B * G + stat, var_out)
    else:
        block = (b * K + k) * G + g  # this launch runs K = (blocks of the call) - 1 programs per row
        tl.store(stats_out_ptr + block, mean_out)
        tl.store(stats_out_ptr + B * K * G + block, var_out)


def _config(T: int, GS: int) -> dict[str, int]:
    """Tile sizes, chosen by hand: on a GPU about 4K elements a tile; under the interpreter 16 timesteps,
    so that tests carry the statistics from tile to tile and from block to block."""
    block_s = next_pow2(GS)
    block_t = min(next_pow2(T), 16 if interpreting() else max(1, 4096 // block_s))
    return dict(BLOCK_T=block_t, BLOCK_S=block_s, num_warps=8)


def block_len(T: int, block_t: int) -> int:
    """Timesteps per parallel block: whole tiles, at most 16 blocks a call and at least two tiles each."""
    return max(2 * block_t, next_pow2(cdiv(T, 16)))


def timestep_norm_triton(
    x: Tensor, weight: Tensor, bias: Tensor, count: int, mean: Tensor, var: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """TimestepNorm by the Triton kernel; same arguments and results as `timestep_norm`."""
    check_input("x", x)
    B, T, D = x.shape
    G = mean.shape[1]
    GS = D // G
    if T == 0:
        return x.clone(), mean, var
    cfg = _config(T, GS)
    L = block_len(T, cfg["BLOCK_T"])
    K = cdiv(T, L)
    y = torch.empty(B, T, D, dtype=x.dtype, device=x.device)
    stats_in = torch.stack([mean, var]).to(torch.float64)  # [2, B, G]
    blocks = torch.empty(2, B, max(K - 1, 1), G, dtype=torch.float64, device=x.device)  # never empty: a GPU pointer
    stats_out = torch.empty(2, B, G, dtype=torch.float64, device=x.device)
    args = (count, B, T, G, GS, L, K, eps, *x.stride())
    if K > 1:  # every block but the last alone: the statistics the blocks after it start from
        _timestep_norm_kernel[(B, G, K - 1)](
            x, y, weight, bias, stats_in, blocks, blocks, 0, B, T, G, GS, L, K - 1, eps, *x.stride(), FINAL=False, **cfg
        )
    _timestep_norm_kernel[(B, G, K)](x, y, weight, bias, stats_in, blocks, stats_out, *args, FINAL=True, **cfg)
    return y, stats_out[0], stats_out[1]
