"""The Triton kernels against their PyTorch references, run by Triton's CPU interpreter (float32, small sizes).

Triton reads TRITON_INTERPRET when it is first imported. megaeval imports it only when a kernel is
first launched (megaeval.kernels.common), and no test module imports it while being collected, so
setting it below, at collection, comes first. Other tests see the variable too; none runs Triton.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from megaeval.kernels import TORCH, TRITON, select
from megaeval.kernels.attention import chunked_attention, chunked_attention_triton
from megaeval.kernels.cema import cema, cema_triton
from megaeval.kernels.common import available
from megaeval.kernels.nll import linear_nll, linear_nll_triton
from megaeval.kernels.timestep_norm import timestep_norm, timestep_norm_triton

from megaeval import MegaevalError, load_model
from megaeval.models.megalodon import MegalodonLM
from megaeval.models.megalodon.model import MultiHeadComplexEMA
from tests.conftest import VOCAB, random_model, small_args

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (see above)
pytestmark = pytest.mark.skipif(not available(), reason="Triton is not installed")

# odd calls, single-token decoding steps, and calls that cross chunk (8) and kernel tile boundaries
SPLITS = [[37], [5, 1, 13, 2, 16], [3, 1, 1, 1, 16, 15], [8, 8, 8, 13]]


def calls(total: int, sizes: list[int]) -> list[slice]:
    assert sum(sizes) == total
    bounds = [0] + [sum(sizes[: i + 1]) for i in range(len(sizes))]
    return [slice(s, e) for s, e in zip(bounds, bounds[1:], strict=False)]


# ------------------------------------------------------------------------------- TimestepNorm


def stream_norm(fn, x, weight, bias, sizes, count=0, mean=None, var=None):
    B, G = x.shape[0], 3
    mean = torch.zeros(B, G, dtype=torch.float64) if mean is None else mean
    var = torch.ones(B, G, dtype=torch.float64) if var is None else var
    ys = []
    for part in calls(x.shape[1], sizes):
        y, mean, var = fn(x[:, part], weight, bias, count, mean, var, 1e-5)
        count += part.stop - part.start
        ys.append(y)
    return torch.cat(ys, 1), mean, var


@pytest.mark.parametrize("sizes", SPLITS)
@pytest.mark.parametrize("prior", [0, 5])
def test_timestep_norm_matches_reference_across_calls(sizes, prior):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 12, generator=g) * 3 + 1.5
    weight, bias = torch.randn(12, generator=g) * 0.3, torch.randn(12, generator=g) * 0.3
    prior_mean = torch.tensor([[0.5, -1.0, 2.0]] * 2, dtype=torch.float64)
    prior_var = torch.tensor([[1.0, 2.7, 0.4]] * 2, dtype=torch.float64)
    expected = stream_norm(timestep_norm, x, weight, bias, [37], prior, prior_mean, prior_var)
    got = stream_norm(timestep_norm_triton, x, weight, bias, sizes, prior, prior_mean, prior_var)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=2e-5)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-6)  # float32 inputs, rounding ~1e-7
    torch.testing.assert_close(got[2], expected[2], rtol=1e-6, atol=0)
    assert got[1].dtype == got[2].dtype == torch.float64


def test_timestep_norm_statistics_stay_float64_exact_over_a_long_shifted_stream():
    """40 calls of 250 tokens at 1000 +- 0.01: float32 arithmetic, statistics as exact as float64."""
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randn(1, 250, 8, generator=g) * 0.01 + 1000.0 for _ in range(40)]
    zeros = torch.zeros(8)
    count, mean, var = 0, torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    ref_mean, ref_var = mean, var
    for c in chunks:
        _, mean, var = timestep_norm_triton(c, zeros, zeros, count, mean, var, 1e-5)
        _, ref_mean, ref_var = timestep_norm(c, zeros, zeros, count, ref_mean, ref_var, 1e-5)
        count += c.shape[1]
    everything = torch.cat(chunks, 1).double().view(1, -1, 2, 4).transpose(1, 2).reshape(1, 2, -1)
    for m, v in ((mean, var), (ref_mean, ref_var)):  # the kernel and the float64 reference, against exact values
        torch.testing.assert_close(m, everything.mean(-1), rtol=0, atol=1e-9)
        torch.testing.assert_close(v, everything.var(-1, unbiased=False), rtol=1e-6, atol=0)
    torch.testing.assert_close(mean, ref_mean, rtol=0, atol=1e-9)


# -------------------------------------------------------------------------------------- CEMA


def random_cema(dim: int, ndim: int, seed: int) -> MultiHeadComplexEMA:
    cema_module = MultiHeadComplexEMA(dim, ndim)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in cema_module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return cema_module


def stream_cema(fn, module, x, h, sizes):
    p, log_q, gamma = module.coefficients()
    ys = []
    for part in calls(x.shape[1], sizes):
        y, h = fn(x[:, part], h, p, log_q, gamma, module.omega)
        ys.append(y)
    return torch.cat(ys, 1), h


@pytest.mark.parametrize("sizes", SPLITS)
def test_cema_matches_reference_across_calls(sizes):
    module = random_cema(6, 3, seed=0)  # N = 3 and D = 6 are not powers of two: masked lanes
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 37, 6, generator=g)
    h0 = torch.randn(2, 6, 3, dtype=torch.complex64, generator=g)
    y_ref, h_ref = stream_cema(cema, module, x, h0, [37])
    y, h = stream_cema(cema_triton, module, x, h0, sizes)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-5)
    assert h.dtype == torch.complex64


def test_cema_long_slowly_decaying_call_stays_accurate():
    """|q| ~ 0.9999 over 600 steps in two calls: float32 kernel within 1e-5 of the float64 reference."""
    module = random_cema(4, 3, seed=4)
    with torch.no_grad():
        module.alpha.fill_(-6.0)
        module.delta.fill_(-3.0)
    x = torch.randn(1, 600, 4, generator=torch.Generator().manual_seed(5))
    y64, h64 = stream_cema(cema, module.double(), x.double(), torch.zeros(1, 4, 3, dtype=torch.complex128), [600])
    y32, h32 = stream_cema(cema_triton, module.float(), x, torch.zeros(1, 4, 3, dtype=torch.complex64), [389, 211])
    assert (y32.double() - y64).abs().max() < 1e-5 * y64.abs().max()
    assert (h32.to(torch.complex128) - h64).abs().max() < 1e-5 * h64.abs().max()


def test_norm_and_cema_take_bfloat16():
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(1, 21, 12, generator=g) + 0.5).bfloat16()
    weight, bias = torch.randn(12, generator=g).bfloat16(), torch.randn(12, generator=g).bfloat16()
    expected = stream_norm(timestep_norm, x, weight, bias, [21])
    got = stream_norm(timestep_norm_triton, x, weight, bias, [13, 8])
    assert got[0].dtype == torch.bfloat16
    torch.testing.assert_close(got[0].float(), expected[0].float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-6)
    module = random_cema(12, 4, seed=3).bfloat16()
    h0 = torch.zeros(1, 12, 4, dtype=torch.complex64)
    y_ref, h_ref = stream_cema(cema, module, x, h0, [21])
    y, h = stream_cema(cema_triton, module, x, h0, [13, 8])
    assert y.dtype == torch.bfloat16 and h.dtype == torch.complex64
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-4)


# --------------------------------------------------------------------------------- attention


def stream_attention(fn, q, k, v, sizes, chunk):
    B, _, H, dz = q.shape
    kc, vc = q.new_zeros(B, 0, H, dz), v.new_zeros(B, 0, H, v.shape[-1])
    outs = []
    for part in calls(q.shape[1], sizes):
        out, kc, vc = fn(q[:, part], k[:, part], v[:, part], kc, vc, chunk, 10000.0)
        assert kc.shape[1] == vc.shape[1] == part.stop % chunk
        outs.append(out)
    return torch.cat(outs, 1), kc, vc


@pytest.mark.parametrize("sizes", SPLITS)
@pytest.mark.parametrize("chunk", [4, 8, 64])
def test_chunked_attention_matches_reference_across_calls(sizes, chunk):
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 37, 2, 6, generator=g), torch.randn(2, 37, 2, 6, generator=g)
    v = torch.randn(2, 37, 2, 5, generator=g)
    expected, kc_ref, vc_ref = stream_attention(chunked_attention, q, k, v, sizes, chunk)
    got, kc, vc = stream_attention(chunked_attention_triton, q, k, v, sizes, chunk)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(kc, kc_ref, rtol=0, atol=0)
    torch.testing.assert_close(vc, vc_ref, rtol=0, atol=0)


def test_attention_scale_is_one_and_bfloat16_inputs_work():
    q = torch.zeros(1, 2, 1, 4)
    q[0, 1, 0, 0] = 1.0
    k = torch.zeros(1, 2, 1, 4)
    k[0, 1, 0, 0] = 3.0
    v = torch.tensor([0.0, 1.0]).view(1, 2, 1, 1)
    out, _, _ = chunked_attention_triton(q, k, v, q[:, :0], v[:, :0], 8, 10000.0)
    assert math.isclose(float(out[0, 1, 0, 0]), 1 / (1 + math.exp(-3.0)), rel_tol=1e-6)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 21, 2, 8, generator=g).bfloat16() for _ in range(3))
    expected, _, _ = stream_attention(chunked_attention, q, k, v, [21], 8)
    got, _, _ = stream_attention(chunked_attention_triton, q, k, v, [13, 8], 8)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=3e-2)


# ------------------------------------------------------------------------------------- NLL


@pytest.mark.parametrize("vocab", [VOCAB, VOCAB + 7])
def test_linear_nll_matches_reference(vocab):
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(2, 37, 16, generator=g)
    weight = torch.randn(vocab, 16, generator=g) * 0.5
    targets = torch.randint(0, vocab, (2, 37), generator=g)
    targets[0, 3] = targets[1, 0] = -100
    got = linear_nll_triton(hidden, weight, targets)
    assert got.shape == targets.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, linear_nll(hidden, weight, targets), rtol=0, atol=1e-5)
    assert got[0, 3] == got[1, 0] == 0.0
    # bfloat16 inputs: logits stay float32 in the kernel (the reference rounds them to bfloat16)
    exact = linear_nll(hidden.bfloat16().float(), weight.bfloat16().float(), targets)
    torch.testing.assert_close(
        linear_nll_triton(hidden.bfloat16(), weight.bfloat16(), targets), exact, atol=1e-4, rtol=0
    )


def test_linear_nll_rejects_out_of_range_targets():
    with pytest.raises(MegaevalError, match="targets must lie in"):
        linear_nll_triton(torch.randn(1, 3, 4), torch.randn(10, 4), torch.tensor([[1, 10, 2]]))


# ------------------------------------------------------------------------------ whole model


class FakeTokenizer:
    vocab_size, bos_id, eos_id = VOCAB, 1, 2

    def describe(self):
        return {"kind": "fake"}


def lm_with(kernels: str, **overrides) -> MegalodonLM:
    return MegalodonLM(random_model(small_args(**overrides), 0, torch.float32), FakeTokenizer(), None, kernels=kernels)


def test_model_with_triton_kernels_matches_torch_in_any_split():
    torch_lm, triton_lm = lm_with("torch"), lm_with("triton")
    assert triton_lm.describe()["kernels"] == {"requested": "triton", "backend": "triton"}
    tokens = torch.randint(0, VOCAB, (2, 29), generator=torch.Generator().manual_seed(0))
    expected, state_ref = torch_lm.forward(tokens, torch_lm.init_state(2))
    state, outs = triton_lm.init_state(2), []
    for part in calls(29, [5, 1, 13, 2, 8]):
        logits, state = triton_lm.forward(tokens[:, part], state)
        outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), expected, rtol=0, atol=1e-4)
    for got, ref in zip(state.tensors(), state_ref.tensors(), strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_model_score_with_triton_kernels_matches_torch():
    torch_lm, triton_lm = lm_with("torch", output_size=VOCAB + 7), lm_with("triton", output_size=VOCAB + 7)
    tokens = torch.randint(0, VOCAB, (1, 21), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(tokens, -1, dims=1)
    targets[0, 4] = -100
    expected, _ = torch_lm.score(tokens, targets, torch_lm.init_state(1))
    got, state = triton_lm.score(tokens[:, :12], targets[:, :12], triton_lm.init_state(1))
    rest, _ = triton_lm.score(tokens[:, 12:], targets[:, 12:], state)
    torch.testing.assert_close(torch.cat([got, rest], 1), expected, rtol=0, atol=1e-4)
    assert got[0, 4] == 0.0


def test_load_model_accepts_and_records_kernels(make_checkpoint, monkeypatch):
    path = make_checkpoint()
    for requested, backend in (("auto", "torch"), ("torch", "torch"), ("triton", "triton")):
        lm = load_model(path, kernels=requested)
        assert lm.describe()["kernels"] == {"requested": requested, "backend": backend}
    assert load_model(path).describe()["kernels"] == {"requested": "auto", "backend": "torch"}
    with pytest.raises(MegaevalError, match="unknown kernels 'fast'"):
        load_model(path, kernels="fast")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(MegaevalError, match="needs a CUDA device"):
        load_model(path, kernels="triton")


# -------------------------------------------------------------------------------- dispatch


def test_dispatcher_choices(monkeypatch):
    assert select("auto", "cpu") is TORCH
    assert select("torch", "cpu") is TORCH and select("torch", "cuda") is TORCH
    assert select("auto", "cuda") is TRITON
    assert select("auto", "cuda", torch.float64) is TORCH  # the kernels compute in float32
    assert select("triton", "cpu") is TRITON  # the interpreter is on (top of this module)
    with pytest.raises(MegaevalError, match="do not run float64 models"):
        select("triton", "cuda", torch.float64)
    with pytest.raises(MegaevalError, match="unknown kernels 'cuda'; use one of: auto, triton, torch"):
        select("cuda", "cpu")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(MegaevalError, match="kernels 'triton' needs a CUDA device, not cpu.*TRITON_INTERPRET=1"):
        select("triton", "cpu")
    with pytest.raises(MegaevalError, match="Triton kernels need a CUDA device"):
        cema_triton(torch.zeros(1, 2, 3), torch.zeros(1, 3, 2, dtype=torch.complex64), *[None] * 4)


# ---------------------------------------------------------------- compiles for a Hopper GPU


def test_kernels_compile_for_an_h100_with_their_gpu_configs():
    """Ahead-of-time compilation to sm_90 cubin (needs no GPU), in a process without the interpreter."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "megaeval.kernels.aot", "--arch", "90"], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    built = json.loads(run.stdout)
    assert set(built) == {"_cema_kernel", "_timestep_norm_kernel", "_chunk_attention_kernel", "_linear_nll_kernel"}
    assert all(0 <= k["shared_bytes"] <= 227 * 1024 and k["cubin_bytes"] > 0 for k in built.values())
