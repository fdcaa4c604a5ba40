"""The decoding step's operations (megaeval.kernels.decode_norm and .decode_attention, gathered in .decode_step): the
PyTorch references against the model's own references at T = 1 (TimestepNorm, CEMA, RMSNorm, chunk attention for
rows), and each Triton kernel (in Triton's CPU interpreter) against its reference, on several rows at their own
counts and slots, with the first and the last slot of a chunk among them, in float32 and bfloat16, shapes that leave
tiles partial and take several tiles a row."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from megaeval.kernels import decode_attention as da
from megaeval.kernels import decode_norm as dn
from megaeval.kernels import decode_step
from megaeval.kernels.attention import rows_attention
from megaeval.kernels.cema import cema
from megaeval.kernels.common import available
from megaeval.kernels.timestep_norm import timestep_norm

triton_only = pytest.mark.skipif(not available(), reason="Triton is not installed")

B, D, G, N = 3, 32, 2, 3  # groups of 16: four tiles of 4 under the interpreter; N = 3 leaves a tile partial
H, DZ, DV, C = 2, 6, 10, 10  # C = 10: three splits of 4 slots, the last partial
COUNTS = [1, 2, 1000]  # the count after this token: a fresh row (nothing carried), its second (w = 1/2), an old one
FILLS = [0, 3, C - 1]  # the first slot, one inside, the last (the token completes its chunk)
# float32: the kernels differ from the references by float32 rounding only; bfloat16: by one rounding of the
# model dtype (the interpreter truncates where a GPU and PyTorch round to nearest), 2**-7 relative, a few of them
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}
DTYPES = [torch.float32, torch.bfloat16]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn64(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def step_weights(count: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    n = torch.tensor(count, dtype=torch.float64)[:, None]
    return n.reciprocal(), (n - 1) / n


def make_norm(g: torch.Generator, fresh: list[bool]) -> dn.Norm:
    mean = torch.randn(B, G, generator=g, dtype=torch.float64) * 0.3
    var = torch.rand(B, G, generator=g, dtype=torch.float64) + 0.5
    fresh_rows = torch.tensor(fresh)
    mean[fresh_rows], var[fresh_rows] = 0.0, 1.0  # a fresh state: prior mean 0, variance 1
    weight = 1.0 + 0.2 * torch.randn(D, generator=g, dtype=torch.float64)
    return dn.Norm(mean, var, weight, 0.1 * torch.randn(D, generator=g, dtype=torch.float64), 1e-5)


def make_cema(g: torch.Generator, affine: bool = True) -> dn.Cema:
    h = torch.complex(torch.randn(B, D, N, generator=g), torch.randn(B, D, N, generator=g))
    angle = torch.rand(D, N, generator=g) * math.pi
    radius = 0.5 + 0.45 * torch.rand(D, N, generator=g)
    q = torch.polar(radius, angle)
    gamma = torch.complex(torch.randn(D, N, generator=g), torch.randn(D, N, generator=g)) / math.sqrt(N)
    rms = 1.0 + 0.2 * torch.randn(D, generator=g) if affine else None
    return dn.Cema(h, torch.rand(D, N, generator=g), q, gamma, 0.5 * torch.randn(D, generator=g), rms, 1e-5)


def clone(obj):
    return type(obj)(*(v.clone() if isinstance(v, torch.Tensor) else v for v in vars(obj).values()))


def slots(fills: list[int] = FILLS, dtype: torch.dtype = torch.float32) -> da.Slots:
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, DZ, 2, dtype=torch.float64) / DZ)
    angle = torch.arange(C, dtype=torch.float64)[:, None] * inv_freq
    rope = torch.complex(angle.cos().to(dtype), angle.sin().to(dtype))
    return da.Slots(torch.tensor(fills), rope, H, torch.arange(C))


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


# ------------------------------------------------------------------ references against the model's own, at T = 1


def test_norm_cema_reference_is_timestep_norm_cema_and_rms_norm_at_one_timestep():
    g = gen(0)
    x = torch.randn(B, D, generator=g, dtype=torch.float64) * 2 + 0.5
    norm = make_norm(g, [False] * B)
    count = 7
    p, log_q = randn64(g, D, N).sigmoid(), torch.complex(-randn64(g, D, N).abs(), randn64(g, D, N))
    gamma, h = (
        torch.complex(randn64(g, D, N), randn64(g, D, N)),
        torch.complex(randn64(g, B, D, N), randn64(g, B, D, N)),
    )
    omega, rms_w = randn64(g, D, 1), randn64(g, D)
    y_want, mean_want, var_want = timestep_norm(x[:, None], norm.weight - 1.0, norm.bias, count, norm.mean, norm.var,
                                                norm.eps)  # fmt: skip
    c_want, h_want = cema(y_want, h, p, log_q, gamma, omega)
    mx_want = F.rms_norm(c_want[:, 0], (D,), rms_w + 1.0, 1e-5)
    state = dn.Cema(h.clone(), p, torch.exp(log_q), gamma, omega.view(-1), rms_w + 1.0, 1e-5)
    got_x, y, mx = dn.norm_cema_step(x, None, None, *step_weights([count + 1] * B), norm, state)
    assert got_x is x
    for got, want in ((y, y_want[:, 0]), (norm.mean, mean_want), (norm.var, var_want), (state.h, h_want),
                      (mx, mx_want)):  # fmt: skip
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_qk_and_attend_references_are_rows_attention():
    g = gen(1)
    at = slots(dtype=torch.float64)
    z, v, r = randn64(g, B, H * DZ), randn64(g, B, H * DV), randn64(g, B, H * DV)
    scale, offset = 1.0 + 0.2 * randn64(g, 2, H * DZ), 0.1 * randn64(g, 2, H * DZ)
    k_cache, v_cache = randn64(g, B, H, C, DZ), randn64(g, B, H, C, DV)
    # the model's path: per-head RMSNorm, affine, then rows_attention over each row's cached keys
    zn = F.rms_norm(z.view(B, 1, H, DZ), (DZ,), None, 1e-5).view(B, 1, 1, -1)
    q_m, k_m = (zn * scale + offset).unbind(2)
    width = max(FILLS)
    attn, keys, values = rows_attention(q_m.view(B, 1, H, DZ), k_m.view(B, 1, H, DZ), F.silu(v).view(B, 1, H, DV),
                                        k_cache.transpose(1, 2)[:, :width], v_cache.transpose(1, 2)[:, :width],
                                        at.fill, C, 10000.0)  # fmt: skip
    want = attn.reshape(B, -1) * F.silu(r)
    k_got, v_got = k_cache.clone(), v_cache.clone()
    q = da.qk_step(z, v, scale, offset, 1e-5, at, k_got, v_got)
    got = da.attend_step(q, k_got, v_got, r, at)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for b, fill in enumerate(FILLS):  # the token's key and value at its slot; the cache after it as rows_attention's
        after = (fill + 1) % C
        torch.testing.assert_close(k_got[b, :, :after].transpose(0, 1), keys[b, :after], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(v_got[b, :, :after].transpose(0, 1), values[b, :after], rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- the kernels against the references


@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", ["none", "ffn", "ffn+alpha"])
def test_norm_cema_kernel_matches_reference(dtype, residual):
    g = gen(2)
    x = (torch.randn(B, D, generator=g) * 2 + 0.5).to(dtype)
    ffn = None if residual == "none" else torch.randn(B, D, generator=g).to(dtype)
    alpha = (0.5 * torch.randn(D, generator=g)).to(dtype) if residual == "ffn+alpha" else None
    norm, state = make_norm(g, [c == 1 for c in COUNTS]), make_cema(g, affine=residual != "ffn")
    inv_n, carried = step_weights(COUNTS)
    norm2, state2, h_before = clone(norm), clone(state), state.h.clone()
    want = dn.norm_cema_step(x, ffn, alpha, inv_n, carried, norm, state)
    got = dn.norm_cema_step_triton(x, ffn, alpha, inv_n, carried, norm2, state2)
    for a, b in zip(got, want, strict=True):
        close(a, b, dtype)
    stats_tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float32 or ffn is None else TOL[dtype]
    torch.testing.assert_close(norm2.mean, norm.mean, **stats_tol)
    torch.testing.assert_close(norm2.var, norm.var, **stats_tol)
    torch.testing.assert_close(state2.h, state.h, **TOL[dtype])
    assert (state2.h - h_before).abs().min() > 0  # every entry stepped


@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_final_norm_kernel_matches_reference(dtype):
    g = gen(3)
    x, ffn = (torch.randn(B, D, generator=g).to(dtype) for _ in range(2))
    alpha = torch.randn(D, generator=g).to(dtype)
    norm = make_norm(g, [False, True, False])
    norm2 = clone(norm)
    inv_n, carried = step_weights(COUNTS)
    for args in ((ffn, alpha), (None, None)):
        want = dn.norm_step(x, *args, inv_n, carried, norm)
        got = dn.norm_step_triton(x, *args, inv_n, carried, norm2)
        for a, b in zip(got, want, strict=True):
            close(a, b, dtype)
        torch.testing.assert_close(norm2.mean, norm.mean, **TOL[dtype])
        torch.testing.assert_close(norm2.var, norm.var, **TOL[dtype])


@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("biases", [False, True])
def test_qk_kernel_matches_reference(dtype, biases):
    g = gen(4)
    at = slots()
    z, v = (torch.randn(B, n, generator=g).to(dtype) * 2 for n in (H * DZ, H * DV))
    scale, offset = 1.0 + 0.2 * torch.randn(2, H * DZ, generator=g), 0.1 * torch.randn(2, H * DZ, generator=g)
    k_cache, v_cache = torch.randn(B, H, C, DZ, generator=g).to(dtype), torch.randn(B, H, C, DV, generator=g).to(dtype)
    bias = [torch.randn(n, generator=g).to(dtype) if biases else None for n in (H * DZ, H * DV)]
    k_got, v_got = k_cache.clone(), v_cache.clone()
    q_want = da.qk_step(z, v, scale, offset, 1e-5, at, k_cache, v_cache, *bias)
    q_got = da.qk_step_triton(z, v, scale, offset, 1e-5, at, k_got, v_got, *bias)
    assert q_got.dtype == torch.float32
    torch.testing.assert_close(q_got, q_want, **TOL[dtype])  # float32, from z in the model dtype
    close(k_got, k_cache, dtype)  # the slot written, every other slot as it was
    close(v_got, v_cache, dtype)
    unwritten = torch.ones(B, C, dtype=torch.bool)
    unwritten[torch.arange(B), at.fill] = False
    assert torch.equal(k_got.transpose(1, 2)[unwritten], k_cache.transpose(1, 2)[unwritten])


@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fills", [FILLS, [C - 1, 5, 8], [0, 0, 0]])
def test_attend_kernel_matches_reference(dtype, fills):
    g = gen(5)
    at = slots(fills)
    q = torch.randn(B, H, DZ, generator=g) * 1.5
    k_cache, v_cache = torch.randn(B, H, C, DZ, generator=g).to(dtype), torch.randn(B, H, C, DV, generator=g).to(dtype)
    past = torch.arange(C)[None, :] > at.fill[:, None]
    k_cache.transpose(1, 2)[past] = 1e4  # slots past a row's key: a kernel that read them would be far off
    v_cache.transpose(1, 2)[past] = float("nan")
    r, r_bias = torch.randn(B, H * DV, generator=g).to(dtype), torch.randn(H * DV, generator=g).to(dtype)
    for bias in (None, r_bias):
        want = da.attend_step(q, k_cache.nan_to_num(), v_cache.nan_to_num(), r, at, bias)
        close(da.attend_step_triton(q, k_cache, v_cache, r, at, bias), want, dtype)


@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
def test_residual_layer_norm_kernel_matches_reference(dtype, affine):
    g = gen(6)
    x, h = (torch.randn(B, 37, generator=g).to(dtype) * 3 for _ in range(2))  # 37: five tiles of 8, the last partial
    w, b = (0.3 * torch.randn(37, generator=g)).to(dtype), (0.1 * torch.randn(37, generator=g)).to(dtype)
    args = (w, b) if affine else (None, None)
    for h_bias in (None, torch.randn(37, generator=g).to(dtype)):
        want = dn.residual_layer_norm(x, h, *args, 1e-5, h_bias)
        close(dn.residual_layer_norm_triton(x, h, *args, 1e-5, h_bias), want, dtype)


def test_the_kernels_run_where_triton_runs():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert decode_step.runs_on(cpu, torch.float32) == available()  # the tests run the interpreter (tests/conftest.py)
    assert not decode_step.runs_on(cpu, torch.float64)
    assert not decode_step.runs_on(cuda, torch.bfloat16)  # interpreted kernels on CUDA tensors: not in a CUDA graph
