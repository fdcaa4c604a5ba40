"""Benchmark (CUDA GPU, written for an H100): a MEGALODON greedy decoding step at batch 1, eager and as CUDA graphs.

    python bench/gpu_decode.py --out decode.json              # the 7B shape, 32 layers (under 90 s)
    python bench/gpu_decode.py --out decode.json --layers 4   # a quick look

A 7B-shaped MEGALODON (model_dim 4096, z 1024, value 8192, 4 heads, FFN 11264 SwiGLU, cema_ndim 16, 64 norm
groups, chunk 2048, vocabulary 32000) with random weights drawn on the GPU in bfloat16 reads a 100-token prompt
eagerly, then one greedy step (one token, batch 1) is timed, over --steps steps after a warm-up:

  eager forward   `MegalodonLM.forward(token [1, 1], state)`, what greedy decoding ran before
  then for each `StaticDecoder` (megalodon/decode.py) step, unfused (decode_step's PyTorch references, some 50
  kernels a layer) and fused (decode_step's Triton kernels, 15 a layer):
  decoder, eager  `StaticDecoder.step` without its graph: the same kernels, launched one by one
  decoder, graph  `StaticDecoder.step` replaying its CUDA graph, what greedy decoding runs on CUDA

Checks, each decoder: its graph's logits against its own eager step (the capture: equal up to float noise), and,
for information only, against the eager forward's over a few teacher-forced steps (in bfloat16 the two round at
different places, and through 32 random layers that drift reaches some percent of the largest logit: it cannot
tell a bug from rounding, which the float32 check below does); the kernels one eager step launches (torch.profiler).
Then a tight check in float32: a 2-layer model of the same widths with chunk 16, two rows at their own positions,
40 teacher-forced graph steps (both decoders) across chunk boundaries against the eager forward (the plain PyTorch
references): max |difference| / max |logit| <= 1e-4, which rounding stays far below and a bug does not.
Each time is set against the time to read the weights once from HBM, at the bandwidth a large device-to-device
copy reaches (bytes read + written) and at the H100 SXM's nominal 3.35 TB/s. Target: the graph step <= 1.5x the
weight-read time. A part that fails is reported (errors in the JSON) and the others still run. Needs torch, triton
and megaeval only; without CUDA it stops with a one-line message.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from megaeval.models.megalodon import Megalodon, MegalodonLM, MegalodonState
from megaeval.models.megalodon.decode import StaticDecoder

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # bench/ beside this file: the shared parts of the GPU benches
from gpu_end_to_end import DEVICE, _Tokenizer, random_model  # noqa: E402

NOMINAL_TBPS = 3.35  # H100 SXM HBM3
TARGET = 1.5  # graph step at most this many times the weight-read time
PROMPT = 100
CHECK_STEPS = 8
MODES = ("unfused", "fused")  # StaticDecoder(fused=False), StaticDecoder(fused=True)
FP32_CHUNK, FP32_PROMPTS, FP32_STEPS = 16, (5, 12), 40  # the float32 check: rows at fills 5 and 12, chunk 16
FP32_TOLERANCE = 1e-4  # max |graph - eager| / max |eager logit|, float32


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
        "ok": bool(torch.isfinite(got).all()) and max(capture) <= 1e-2 * float(want.abs().max()),  # the capture
    }  # fmt: skip


def float32_check(seed: int = 2) -> dict[str, Any]:
    """The graph step of both decoders against the eager forward (kernels "torch": the references) in float32, on a
    2-layer model of the 7B widths with chunk 16: two rows at their own positions, FP32_STEPS teacher-forced steps."""
    matmul_tf32, cudnn_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 products, not TF32
    try:
        with torch.inference_mode(False):  # parameters made as `main` makes them, outside inference mode
            model = random_model(2, seed, torch.float32, chunk_size=FP32_CHUNK)
        lm = MegalodonLM(model, _Tokenizer(model.args.vocab_size), None, kernels="torch")
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        V, B = model.args.vocab_size, len(FP32_PROMPTS)
        rows = [lm.forward(torch.randint(3, V, (1, n), device=DEVICE, generator=g), lm.init_state(1))[1]
                for n in FP32_PROMPTS]  # fmt: skip
        state = MegalodonState.stack(rows)
        tokens = torch.randint(3, V, (B, FP32_STEPS), device=DEVICE, generator=g)
        decoders = {mode: StaticDecoder(model, B, graph=True, fused=mode == "fused") for mode in MODES}
        for decoder in decoders.values():
            decoder.load(state)
        rel = {mode: [] for mode in MODES}
        for t in range(FP32_STEPS):
            want, state = lm.forward(tokens[:, t : t + 1], state)
            want = want[:, 0]
            for mode, decoder in decoders.items():
                got = decoder.step(tokens[:, t])
                rel[mode].append(float((got - want).abs().max() / want.abs().max()))
        out: dict[str, Any] = {
            "layers": 2, "chunk": FP32_CHUNK, "rows_fills": [n % FP32_CHUNK for n in FP32_PROMPTS],
            "steps": FP32_STEPS, "tolerance": FP32_TOLERANCE,
        }  # fmt: skip
        for mode, decoder in decoders.items():
            after = decoder.state()
            cema = max(float((a.cema - b.cema).abs().max() / b.cema.abs().max())
                       for a, b in zip(after.layers, state.layers, strict=True))  # fmt: skip
            ok = max(rel[mode]) <= FP32_TOLERANCE and all(math.isfinite(x) for x in rel[mode])
            out[mode] = {"max_rel_diff_vs_eager_forward": max(rel[mode]), "cema_state_max_rel_diff": cema, "ok": ok}
        out["ok"] = all(out[mode]["ok"] for mode in MODES)
        return out
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul_tf32, cudnn_tf32


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
    rows.append(f"{'step (batch 1)':<24} | {'ms/step':>8} | {'x read (measured)':>17} | {'x read (nominal)':>16} | "
                f"kernels/step")  # fmt: skip

    def line(label: str, ms: float | None, kernels: Any = "") -> None:
        if ms is None:
            rows.append(f"{label:<24} | {'failed':>8} |")
            return
        measured = f"{ms / read_ms:.2f}x" if read_ms else "-"
        rows.append(f"{label:<24} | {ms:8.2f} | {measured:>17} | {ms / nominal_ms:15.2f}x | {kernels}")

    line("eager forward", r.get("eager_forward_ms"))
    decoders = r.get("decoders", {})
    for mode in MODES:
        d = decoders.get(mode, {})
        line(f"decoder {mode}, eager", d.get("eager_ms"), d.get("kernels_per_step", ""))
        line(f"decoder {mode}, graph", d.get("graph_ms"))
    for mode in MODES:
        graph = decoders.get(mode, {}).get("graph_ms")
        if graph is not None and read_ms:
            met = "met" if graph <= TARGET * read_ms else "NOT met"
            rows.append(f"Target graph step ({mode}) <= {TARGET}x weight read (measured bandwidth): {met} "
                        f"({graph / read_ms:.2f}x)")  # fmt: skip
    for mode in MODES:
        d = decoders.get(mode, {})
        check = d.get("check")
        if check:
            capture = check["max_abs_diff_vs_decoder_eager"]
            rows.append(f"Check {mode} graph vs its eager step: max |diff| {capture:.2e} "
                        f"{'ok' if check['ok'] else 'FAILED'}; bfloat16 drift vs eager forward (information): "
                        f"max |diff| / max |logit| {check['max_rel_diff_vs_eager_forward']:.2e}, top-1 agree "
                        f"{check['top1_agree_vs_eager_forward']}/{check['steps']}; "
                        f"capture {d.get('capture_s')} s")  # fmt: skip
    f32 = r.get("float32_check")
    if f32:
        parts = ", ".join(f"{mode} {f32[mode]['max_rel_diff_vs_eager_forward']:.2e}" for mode in MODES if mode in f32)
        rows.append(f"Check float32 ({f32['layers']} layers, chunk {f32['chunk']}, fills {f32['rows_fills']}, "
                    f"{f32['steps']} graph steps) max |diff| / max |logit| vs eager forward: {parts} "
                    f"(<= {f32['tolerance']:g}): {'ok' if f32['ok'] else 'FAILED'}")  # fmt: skip
    rows.append(f"lm.decoder(1) on CUDA: {r.get('lm_decoder')}; errors: {sorted(r.get('errors', {})) or 'none'}; "
                f"{r.get('seconds')} s")  # fmt: skip
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


def describe(decoder: StaticDecoder | None) -> str:
    """What `MegalodonLM.decoder` gives: its class, and whether its step is fused."""
    return "None" if decoder is None else f"{type(decoder).__name__}, fused={decoder.fused}"


def measure_decoder(r: dict, lm: MegalodonLM, mode: str, state: Any, token: torch.Tensor, steps: int) -> dict:
    """One decoder kind (`mode` in MODES): its graph's capture and step, its eager step, the kernels one step
    launches, its check against the eager forward; failures go to r["errors"]."""
    d: dict[str, Any] = {}
    fused, model = mode == "fused", lm.model
    t0 = time.perf_counter()
    graph = attempt(r, f"{mode}_graph_decoder", lambda: StaticDecoder(model, 1, graph=True, fused=fused), store=False)
    torch.cuda.synchronize()
    d["capture_s"] = round(time.perf_counter() - t0, 3) if graph is not None else None
    eager = attempt(r, f"{mode}_eager_decoder", lambda: StaticDecoder(model, 1, fused=fused), store=False)
    if graph is not None:
        timed = lambda: ms_per_step(decoder_stepper(graph, state, token), steps)  # noqa: E731
        d["graph_ms"] = attempt(r, f"{mode}_graph_ms", timed, store=False)
    if eager is not None:
        timed = lambda: ms_per_step(decoder_stepper(eager, state, token), min(steps, 20))  # noqa: E731
        d["eager_ms"] = attempt(r, f"{mode}_eager_ms", timed, store=False)
        count = attempt(r, f"{mode}_kernels_per_step", lambda: kernels_per_step(eager, token), store=False)
        d["kernels_per_step"] = count
        if count:
            d["kernels_per_layer_about"] = round(count / model.args.num_layers, 1)
    if graph is not None and eager is not None:
        d["check"] = attempt(r, f"{mode}_check", lambda: compare(lm, graph, eager, state, token), store=False)
    return d


def run(model: Megalodon, steps: int, kernels: str, out: str) -> dict[str, Any]:
    """Every measurement and check, as a dict (written to `out` after each decoder, then again at the end)."""
    lm = MegalodonLM(model, _Tokenizer(model.args.vocab_size), None, kernels=kernels)
    a = model.args
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    r: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": a.num_layers,
        "config": a.to_dict(), "parameters": sum(p.numel() for p in model.parameters()), "weight_bytes": weight_bytes,
        "weight_read_ms_nominal": weight_bytes / (NOMINAL_TBPS * 1e12) * 1e3, "target_ratio": TARGET, "steps": steps,
        "prompt_tokens": PROMPT, "kernels": kernels,
        "cache_bytes_read_per_graph_step": {  # unfused: the whole chunk, keys in float32; fused: up to the fill
            "unfused": a.num_layers * a.chunk_size * (a.z_dim * 4 + a.value_dim * 2),
            "fused": a.num_layers * (PROMPT % a.chunk_size + 1) * (a.z_dim + a.value_dim) * 2},
        "decoders": {},
    }  # fmt: skip
    bw = attempt(r, "bandwidth_tbps", lambda: copy_bandwidth() / 1e12)
    r["weight_read_ms"] = weight_bytes / (bw * 1e12) * 1e3 if bw else None
    torch.cuda.empty_cache()

    g = torch.Generator(device=DEVICE).manual_seed(1)
    prompt = torch.randint(3, a.vocab_size, (1, PROMPT), device=DEVICE, generator=g)
    state = lm.advance(prompt, lm.init_state(1))
    token = prompt[:, -1:]
    attempt(r, "eager_forward_ms", lambda: ms_per_step(eager_stepper(lm, state.clone(), token), steps))

    for mode in MODES:
        r["decoders"][mode] = measure_decoder(r, lm, mode, state, token, steps)
        torch.cuda.empty_cache()  # the decoders' buffers freed before the next ones
        with open(out, "w") as f:
            json.dump(r, f, indent=1)
    attempt(r, "float32_check", float32_check)
    torch.cuda.empty_cache()
    attempt(r, "lm_decoder", lambda: describe(lm.decoder(1)))
    return r


if __name__ == "__main__":
    main()
