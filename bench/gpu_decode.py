"""Benchmark (CUDA GPU, written for an H100): a MEGALODON greedy decoding step at batch 1, eager and as a CUDA graph.

    python bench/gpu_decode.py --out decode.json              # the 7B shape, 32 layers (about a minute)
    python bench/gpu_decode.py --out decode.json --layers 4   # a quick look

A 7B-shaped MEGALODON (model_dim 4096, z 1024, value 8192, 4 heads, FFN 11264 SwiGLU, cema_ndim 16, 64 norm
groups, chunk 2048, vocabulary 32000) with random weights drawn on the GPU in bfloat16 reads a 100-token prompt
eagerly, then one greedy step (one token, batch 1) is timed three ways, over --steps steps after a warm-up:

  eager forward   `MegalodonLM.forward(token [1, 1], state)`, what greedy decoding ran before
  decoder, eager  `StaticDecoder.step` (megalodon/decode.py) without its graph: the same kernels, launched one by one
  decoder, graph  `StaticDecoder.step` replaying its CUDA graph, what greedy decoding runs on CUDA now

Checks: the graph's logits against the eager forward's over a few teacher-forced steps (bfloat16 tolerance: max
|difference| <= 5% of max |logit|) and against the decoder's own eager step (the capture: equal up to float noise).
Each time is set against the time to read the weights once from HBM, at the bandwidth a large device-to-device
copy reaches (bytes read + written) and at the H100 SXM's nominal 3.35 TB/s. Target: the graph step <= 1.5x the
weight-read time. Needs torch, triton and megaeval only; without CUDA it stops with a one-line message.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from megaeval.models.megalodon import Megalodon, MegalodonLM, ModelArgs
from megaeval.models.megalodon.decode import StaticDecoder

SEVEN_B = dict(
    model_dim=4096, z_dim=1024, value_dim=8192, num_heads=4, ffn_hidden_dim=11264, cema_ndim=16, chunk_size=2048,
    norm_num_groups=64, swiglu=True, vocab_size=32000,
)  # fmt: skip
DEVICE = "cuda"
NOMINAL_TBPS = 3.35  # H100 SXM HBM3
TARGET = 1.5  # graph step at most this many times the weight-read time
PROMPT = 100
CHECK_STEPS = 8
CHECK_TOLERANCE = 0.05  # max |graph - eager| / max |eager logit|


class _Tokenizer:
    bos_id, eos_id = 1, 2

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def describe(self) -> dict[str, Any]:
        return {}


@torch.no_grad()
def random_model(layers: int, seed: int = 0) -> Megalodon:
    """The 7B-shaped model in bfloat16 on the GPU: built on the meta device, materialised there, and filled in place
    with `Megalodon.init_weights`' distributions (8.6B numbers drawn on the CPU would take minutes)."""
    with torch.device("meta"):
        model = Megalodon(ModelArgs(num_layers=layers, **SEVEN_B))
    model = model.to(torch.bfloat16).to_empty(device=DEVICE)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    D = model.args.model_dim
    for buf in model.buffers():  # the norms' priors: none (count 0, mean 0, log-variance 0)
        buf.zero_()
    for name, p in model.named_parameters():  # norm weights 0 (scale 1), biases 0, q/k scales and offsets 0
        if name.endswith(("norm.weight", "norm.bias", ".bias", "mega.gamma", "mega.beta")):
            p.zero_()
    model.embed.weight.normal_(0.0, D**-0.5, generator=g)
    model.output.output.weight.normal_(0.0, D**-0.5, generator=g)
    for block in model.layers:
        m, f = block.mega, block.nffn
        for lin in (m.wv, m.wz, m.wr, m.wh1, m.wh2, f.fc1, f.fc2) + ((f.fc3,) if f.fc3 is not None else ()):
            lin.weight.normal_(0.0, math.sqrt(2.0 / lin.weight.shape[1]), generator=g)
        e = m.cema
        e.alpha.normal_(0.0, 0.2, generator=g)
        e.delta.normal_(0.0, 0.2, generator=g)
        freqs = torch.exp(-torch.arange(1, D + 1, dtype=torch.float64, device=DEVICE) * math.log(D) / D)
        freqs = freqs[torch.randperm(D, generator=g, device=DEVICE)]
        e.theta.copy_(torch.log(freqs / (1 - freqs)).view(D, 1, 1))
        e.gamma.normal_(0.0, 1.0, generator=g)
        e.gamma[:, :, 1] = 0.0
        e.omega.copy_(torch.randn(D, 1, generator=g, device=DEVICE).mul_(0.25).clamp_(-1.0, 1.0))
    return model.eval().requires_grad_(False)


def copy_bandwidth(nbytes: int = 1 << 31, reps: int = 20) -> float:
    """HBM bandwidth in bytes/s: a device-to-device copy of `nbytes`, counting the bytes read and written."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes * reps / (start.elapsed_time(end) / 1e3)


def ms_per_step(step: Callable[[], None], steps: int, warmup: int = 3) -> float:
    """Wall-clock milliseconds per call of `step` (each feeds the next token on the GPU), synchronised."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps


def eager_stepper(lm: MegalodonLM, state: Any, token: torch.Tensor) -> Callable[[], None]:
    """A greedy step through `MegalodonLM.forward`, its state and token carried from call to call."""
    box = [state, token]

    def step() -> None:
        logits, box[0] = lm.forward(box[1], box[0])
        box[1] = logits[:, -1].argmax(-1, keepdim=True)

    return step


def decoder_stepper(decoder: StaticDecoder, state: Any, token: torch.Tensor) -> Callable[[], None]:
    """A greedy step through `decoder.step`, from `state`, the next token chosen on the GPU."""
    decoder.load(state)
    box = [token.view(-1)]

    def step() -> None:
        box[0] = decoder.step(box[0]).argmax(-1)

    return step


def compare(lm: MegalodonLM, decoder: StaticDecoder, other: StaticDecoder, state: Any, token: torch.Tensor) -> dict:
    """Teacher-forced steps from `state` (the eager forward's greedy tokens): the graph decoder's logits against the
    eager forward's and against `other`, the same decoder without its graph."""
    st = state.clone()
    decoder.load(state)
    other.load(state)
    rel, capture, agree = [], [], 0
    for _ in range(CHECK_STEPS):
        want, st = lm.forward(token, st)
        want = want[:, -1]
        got = decoder.step(token.view(-1))
        eager = other.step(token.view(-1))
        rel.append(float((got - want).abs().max() / want.abs().max()))
        capture.append(float((got - eager).abs().max()))
        agree += int(torch.equal(got.argmax(-1), want.argmax(-1)))
        token = want.argmax(-1, keepdim=True)
    return {
        "steps": CHECK_STEPS, "finite": bool(torch.isfinite(got).all()),
        "max_rel_diff_vs_eager_forward": max(rel), "top1_agree_vs_eager_forward": agree,
        "max_abs_diff_vs_decoder_eager": max(capture),
        "ok": max(rel) <= CHECK_TOLERANCE and max(capture) <= 1e-2 * float(want.abs().max()),
    }  # fmt: skip


def kernels_per_step(decoder: StaticDecoder, token: torch.Tensor) -> int | None:
    """GPU kernels (and copies) one eager decoder step launches: what its graph holds (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    decoder.step(token.view(-1))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        decoder.step(token.view(-1))
        torch.cuda.synchronize()
    count = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return count or None  # None: this profiler reported no device events


def attempt(r: dict, key: str, fn: Callable[[], Any], store: bool = True) -> Any:
    """fn(), stored under `key` with `store`; a failure is printed and stored under errors[key], and None returned."""
    try:
        value = fn()
    except Exception as exc:  # one broken part must not lose the others' numbers
        traceback.print_exc()
        r.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}"
        value = None
    if store:
        r[key] = value
    return value


def table(r: dict) -> str:
    size = f"{r['parameters'] / 1e9:.2f}B parameters, weights {r['weight_bytes'] / 1e9:.2f} GB (bfloat16)"
    rows = [f"{r['device']} | torch {r['torch']} | {r['layers']} layers, {size}"]
    bw, read_ms, nominal_ms = r.get("bandwidth_tbps"), r.get("weight_read_ms"), r["weight_read_ms_nominal"]
    if bw:
        rows.append(f"HBM copy bandwidth {bw:.2f} TB/s: weight read {read_ms:.2f} ms | nominal {NOMINAL_TBPS} TB/s: "
                    f"{nominal_ms:.2f} ms")  # fmt: skip
    rows.append(f"{'step (batch 1)':<18} | {'ms/step':>8} | {'x read (measured)':>17} | {'x read (nominal)':>16}")
    for key, label in (("eager_forward_ms", "eager forward"), ("decoder_eager_ms", "decoder, eager"),
                       ("decoder_graph_ms", "decoder, graph")):  # fmt: skip
        ms = r.get(key)
        if ms is None:
            rows.append(f"{label:<18} | {'failed':>8} |")
            continue
        measured = f"{ms / read_ms:.2f}x" if read_ms else "-"
        rows.append(f"{label:<18} | {ms:8.2f} | {measured:>17} | {ms / nominal_ms:15.2f}x")
    graph = r.get("decoder_graph_ms")
    if graph is not None and read_ms:
        met = "met" if graph <= TARGET * read_ms else "NOT met"
        rows.append(f"Target graph step <= {TARGET}x weight read (measured bandwidth): {met} ({graph / read_ms:.2f}x)")
    check = r.get("check")
    if check:
        rows.append(f"Check vs eager forward ({check['steps']} steps): max |diff| / max |logit| "
                    f"{check['max_rel_diff_vs_eager_forward']:.2e}, top-1 agree {check['top1_agree_vs_eager_forward']}"
                    f"/{check['steps']}; vs decoder eager: max |diff| {check['max_abs_diff_vs_decoder_eager']:.2e}; "
                    f"{'ok' if check['ok'] else 'FAILED'}")  # fmt: skip
    rows.append(f"Kernels per decoder step: {r.get('kernels_per_step')}; graph capture {r.get('capture_s')} s; "
                f"lm.decoder(1) on CUDA: {r.get('lm_decoder')}")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--layers", type=int, default=32, help="layers of the 7B-shaped model (default 32)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps of each kind (default 50)")
    parser.add_argument("--kernels", default="auto", help="kernels of the eager forward: auto, triton or torch")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_decode.py needs a CUDA GPU (written for an H100) and torch sees none")
    t_start = time.perf_counter()
    model = random_model(args.layers)
    with torch.inference_mode():
        r = run(model, args.steps, args.kernels, args.out)
    r["seconds"] = round(time.perf_counter() - t_start, 1)
    with open(args.out, "w") as f:
        json.dump(r, f, indent=1)
    print(table(r))


def run(model: Megalodon, steps: int, kernels: str, out: str) -> dict[str, Any]:
    """Every measurement and check, as a dict (written to `out` once the timings are in, then again at the end)."""
    lm = MegalodonLM(model, _Tokenizer(model.args.vocab_size), None, kernels=kernels)
    a = model.args
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    r: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": a.num_layers,
        "config": a.to_dict(), "parameters": sum(p.numel() for p in model.parameters()), "weight_bytes": weight_bytes,
        "weight_read_ms_nominal": weight_bytes / (NOMINAL_TBPS * 1e12) * 1e3, "target_ratio": TARGET, "steps": steps,
        "prompt_tokens": PROMPT, "kernels": kernels,
        "cache_bytes_read_per_graph_step": a.num_layers * a.chunk_size * (a.z_dim * 4 + a.value_dim * 2),
    }  # fmt: skip
    bw = attempt(r, "bandwidth_tbps", lambda: copy_bandwidth() / 1e12)
    r["weight_read_ms"] = weight_bytes / (bw * 1e12) * 1e3 if bw else None
    torch.cuda.empty_cache()

    g = torch.Generator(device=DEVICE).manual_seed(1)
    prompt = torch.randint(3, a.vocab_size, (1, PROMPT), device=DEVICE, generator=g)
    state = lm.advance(prompt, lm.init_state(1))
    token = prompt[:, -1:]
    attempt(r, "eager_forward_ms", lambda: ms_per_step(eager_stepper(lm, state.clone(), token), steps))

    t0 = time.perf_counter()
    graph = attempt(r, "graph_decoder", lambda: StaticDecoder(model, 1, graph=True), store=False)
    torch.cuda.synchronize()
    r["capture_s"] = round(time.perf_counter() - t0, 3) if graph is not None else None
    eager = attempt(r, "eager_decoder", lambda: StaticDecoder(model, 1), store=False)
    if graph is not None:
        attempt(r, "decoder_graph_ms", lambda: ms_per_step(decoder_stepper(graph, state, token), steps))
    if eager is not None:
        attempt(r, "decoder_eager_ms", lambda: ms_per_step(decoder_stepper(eager, state, token), min(steps, 20)))
    if graph is not None and eager is not None:
        attempt(r, "check", lambda: compare(lm, graph, eager, state, token))
    with open(out, "w") as f:
        json.dump(r, f, indent=1)
    if eager is not None:
        attempt(r, "kernels_per_step", lambda: kernels_per_step(eager, token))
    graph = eager = None  # their buffers freed before lm.decoder builds its own
    torch.cuda.empty_cache()
    attempt(r, "lm_decoder", lambda: type(lm.decoder(1)).__name__)
    return r


if __name__ == "__main__":
    main()
