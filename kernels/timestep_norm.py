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
    step_mean: Tensor, step_var: Tensor, count: int, mean: Tensor, var: Tensor, weight: int = 1
) -> tuple[Tensor, Tensor]:
    """Running mean/variance after each timestep, each timestep one equally weighted group sample.

    step_mean, step_var: [B, T, G] float64 moments of each timestep's group; count, mean, var: the
    carried statistics. Returns the pooled mean and (population) variance over the carried statistics
    and timesteps 1..t, for every t. Sums are taken around the carried mean so that float64 keeps
    them exact over long streams. `weight`: timesteps each entry stands for (the Triton path pools
    blocks of timesteps, each entry a block's moments).
    """
    T = step_mean.shape[1]
    n = count + weight * torch.arange(1, T + 1, dtype=torch.float64, device=step_mean.device)[:, None]
    d = step_mean - mean[:, None]
    s1 = d.cumsum(1) if weight == 1 else (weight * d).cumsum(1)
    s2 = (step_var + d * d).cumsum(1) if weight == 1 else (weight * (step_var + d * d)).cumsum(1)
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


@jit(do_not_specialize=["count"])
def _timestep_norm_kernel(
    x_ptr, y_ptr, w_ptr, b_ptr, stats_in_ptr, stats_out_ptr,
    count, B, T, G, GS, L, K, eps,
    sxb, sxt, sxd,
    FINAL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """One program: batch row b, group g, the timesteps [k L, (k + 1) L) of block k, in tiles of BLOCK_T.

    A call is cut into K blocks of L timesteps, run in parallel in two launches. The first (FINAL false) takes
    each block from a fresh state and stores only its statistics, [4, B, K, G]; the wrapper pools them into each
    block's starting statistics. The second (FINAL true) starts block k from those (stats_in [4, B, K, G], after
    count + k L timesteps), writes y, and its last block writes the statistics after the call ([4, B, G]).

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
    block_stat = (b * K + k) * G + g  # in [4, B, K, G]
    t_start = k * L
    t_end = tl.minimum(t_start + L, T)
    x_base = x_ptr + b * sxb + d * sxd
    y_base = y_ptr + b * T * G * GS + d
    if FINAL:
        m_hi = tl.load(stats_in_ptr + block_stat)
        m_lo = tl.load(stats_in_ptr + B * K * G + block_stat)
        v_hi = tl.load(stats_in_ptr + 2 * B * K * G + block_stat)
        v_lo = tl.load(stats_in_ptr + 3 * B * K * G + block_stat)
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
            n = c + (t - t_start + 1).to(tl.float32)
            mu = tl.cumsum(a, axis=0) / n
            var = v_hi + (v_lo + tl.cumsum(e_t, axis=0) / n - mu * mu)
            rstd = 1.0 / tl.sqrt(tl.maximum(var, 0.0) + eps)
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
    if FINAL:
        if k == K - 1:
            stat = b * G + g  # in [4, B, G]
            tl.store(stats_out_ptr + stat, m_hi)
            tl.store(stats_out_ptr + B * G + stat, m_lo)
            tl.store(stats_out_ptr + 2 * B * G + stat, v_hi)
            tl.store(stats_out_ptr + 3 * B * G + stat, v_lo)
    else:
        tl.store(stats_out_ptr + block_stat, m_hi)
        tl.store(stats_out_ptr + B * K * G + block_stat, m_lo)
        tl.store(stats_out_ptr + 2 * B * K * G + block_stat, v_hi)
        tl.store(stats_out_ptr + 3 * B * K * G + block_stat, v_lo)


def _split(t: Tensor) -> tuple[Tensor, Tensor]:
    """float64 -> float32 (hi, lo) with hi + lo equal to t to about 48 bits."""
    hi = t.to(torch.float32)
    return hi, (t - hi.to(torch.float64)).to(torch.float32)


def _config(T: int, GS: int) -> dict[str, int]:
    """Tile sizes, chosen by hand: on a GPU about 4K elements a tile; under the interpreter 16 timesteps,
    so that tests carry the statistics from tile to tile and from block to block."""
    block_s = next_pow2(GS)
    block_t = min(next_pow2(T), 16 if interpreting() else max(1, 4096 // block_s))
    return dict(BLOCK_T=block_t, BLOCK_S=block_s, num_warps=8)


def block_len(T: int, block_t: int) -> int:
    """Timesteps per parallel block: whole tiles, at most 16 blocks a call and at least two tiles each."""
    return max(2 * block_t, next_pow2(cdiv(T, 16)))


def _pairs(mean: Tensor, var: Tensor) -> Tensor:
    """float64 mean and variance [...] -> float32 [4, ...]: (hi, lo) of each."""
    return torch.stack([*_split(mean), *_split(var)])


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
    args = (x.stride(0), x.stride(1), x.stride(2))
    starts = _pairs(mean, var)[:, :, None]  # [4, B, 1, G]: block 0 starts from the carried statistics
    if K > 1:  # every block but the last alone, then pooled into the statistics each block starts from
        alone = torch.empty(4, B, K - 1, G, dtype=torch.float32, device=x.device)
        _timestep_norm_kernel[(B, G, K - 1)](
            x, y, weight, bias, alone, alone, 0, B, T, G, GS, L, K - 1, eps, *args, FINAL=False, **cfg
        )
        pooled = alone.to(torch.float64)
        block_mean, block_var = pooled[0] + pooled[1], (pooled[2] + pooled[3]).clamp_min(0)
        before_mean, before_var = cumulative_moments(block_mean, block_var, count, mean, var, weight=L)
        starts = torch.cat([starts, _pairs(before_mean, before_var)], 2)
    stats_out = torch.empty(4, B, G, dtype=torch.float32, device=x.device)
    _timestep_norm_kernel[(B, G, K)](
        x, y, weight, bias, starts.contiguous(), stats_out, count, B, T, G, GS, L, K, eps, *args, FINAL=True, **cfg
    )
    out = stats_out.to(torch.float64)
    return y, out[0] + out[1], (out[2] + out[3]).clamp_min(0)
