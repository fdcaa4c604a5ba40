"""MFU's denominator (a device's peak matmul throughput: nominal, measured or given) and its arithmetic."""

from __future__ import annotations

import pytest
import torch

from megaeval import MegaevalError
from megaeval.runs import utilisation as u


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, ("H100 SXM", 989.0)),
        ("NVIDIA H100 PCIe", torch.float16, ("H100 PCIe", 756.0)),
        ("NVIDIA H100 NVL", torch.bfloat16, ("H100 NVL", 835.0)),
        ("NVIDIA H200", torch.bfloat16, ("H200 SXM", 989.0)),
        ("NVIDIA A100-SXM4-80GB", torch.bfloat16, ("A100", 312.0)),
        ("NVIDIA A100-SXM4-80GB", torch.float32, ("A100", 19.5)),
        ("NVIDIA L40S", torch.bfloat16, ("L40S", 362.0)),
        ("NVIDIA L4", torch.bfloat16, ("L4", 121.0)),
        ("NVIDIA H100 80GB HBM3", torch.float64, None),  # a dtype the table lacks: measured instead
        ("Tesla T4", torch.float16, None),
    ],
)
def test_nominal_peaks(name, dtype, expected):
    assert u.nominal_tflops(name, dtype) == expected


def test_mfu_arithmetic_from_given_numbers():
    # 1 GFLOP a token, 20,000 tokens in 2 s: 10 TFLOP/s; on 2 devices of 100 TFLOP/s, 5 %
    assert u.utilisation(1e9, 20_000, 2.0, 100.0, devices=2) == {"achieved_tflops": 10.0, "mfu": 0.05}
    assert u.utilisation(1e9, 20_000, 2.0, 100.0)["mfu"] == pytest.approx(0.1)
    for unknown in [(None, 20_000, 2.0, 100.0), (1e9, 20_000, 2.0, None), (1e9, 0, 0.0, 100.0)]:
        assert u.utilisation(*unknown) == {"achieved_tflops": None, "mfu": None}


def test_no_peak_on_a_cpu_unless_given():
    assert u.device_peak("auto", "cpu", torch.float32) == u.Peak(None, None, None)
    assert u.device_peak("measure", "cpu", torch.bfloat16).tflops is None
    assert u.device_peak("312", "cpu", torch.float32) == u.Peak(312.0, "flag", None)
    assert u.device_peak("312", "cpu", torch.float32).describe() == {
        "peak_tflops": 312.0, "peak_tflops_source": "flag", "peak_tflops_detail": None,
    }  # fmt: skip


def test_cuda_peak_is_nominal_when_known_else_measured(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(u, "measure_matmul_tflops", lambda device, dtype, n=u.MATMUL_SIZE: 700.04)
    cuda = torch.device("cuda", 0)
    assert u.device_peak("auto", cuda, torch.bfloat16) == u.Peak(989.0, "nominal", "H100 SXM bfloat16 dense")
    measured = u.device_peak("measure", cuda, torch.bfloat16)
    assert (measured.tflops, measured.source) == (700.0, "measured")
    assert u.device_peak("auto", cuda, torch.float64).source == "measured"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert u.device_peak("auto", cuda, torch.bfloat16).source == "measured"


@pytest.mark.parametrize("bad", ["", "fast", "0", "-5", "nan", "inf", "5e-324", "1e300"])
def test_bad_peak_flags_are_refused(bad):
    with pytest.raises(MegaevalError, match="--peak-tflops"):
        u.parse_peak(bad)
