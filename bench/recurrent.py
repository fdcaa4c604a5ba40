"""Benchmark: megaeval's Mamba-1 against transformers' own forward, and the flat memory of a recurrent sweep.

speed: one call of `--tokens` tokens (default 4,096) through a Mamba checkpoint (`--model DIR`; default: a random
Mamba of the embedded zoo's size, 6 layers x 128, state 16, saved by transformers with the zoo's tokenizer), on CPU
with one thread in float32: megaeval's `forward` (chunked parallel scan, state carried) against transformers'
MambaForCausalLM forward (use_cache=False; its pure-PyTorch path on a machine without mamba_ssm). Checks that the
logits agree, then prints tokens/s of both and the ratio. Target: >= 5x.

memory: `megaeval ppl-sweep` of the same checkpoint over the six Austen novels from 4K to 256K tokens of
context, one sequence per length; peak memory (process RSS, reset per length) of the longest over the shortest.
Target: <= 1.2.

scan: each recurrent family (a random model of the zoo's size, 6 layers x 128, saved by transformers) read in one
call of 4K and of 64K tokens: megaeval with its blocked O(T) scan, megaeval with the previous Hillis-Steele scan
(kept here, for this comparison; Mamba-1 then in its previous chunks of 16), and transformers' forward (4K only:
its pure-PyTorch paths loop over tokens). Mamba-2 and RWKV do not use the scan: their rows show they did not move.

    python bench/recurrent.py speed [--tokens 4096] [--model DIR]
    python bench/recurrent.py memory [--lengths 4K,...,256K]
    python bench/recurrent.py scan [--families mamba,recurrent_gemma,mamba2,rwkv] [--lengths 4096,65536]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
ZOO_TOKENIZER = REPO / "megaeval" / "assets" / "transformer-tiny"  # the zoo's tokenizer as transformers files
SIZE = dict(vocab_size=4096, hidden_size=128, state_size=16, num_hidden_layers=6, expand=2, conv_kernel=4)


def random_mamba(folder: Path) -> Path:
    """A random Mamba of the zoo's size saved by transformers, with the zoo's tokenizer (made once)."""
    import shutil

    import transformers

    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        transformers.MambaForCausalLM(transformers.MambaConfig(**SIZE, bos_token_id=1, eos_token_id=2)).save_pretrained(
            folder
        )
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(ZOO_TOKENIZER / name, folder / name)
    return folder


def timed(fn, repeats: int) -> tuple[float, torch.Tensor]:
    """Best wall time of `repeats` calls, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def speed(a: argparse.Namespace) -> dict:
    import transformers

    from megaeval import load_model

    torch.set_num_threads(1)
    a.model = a.model or random_mamba(a.work / "mamba")
    lm = load_model(a.model, dtype="float32")
    ref = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    tokens = torch.randint(3, lm.tokenizer.vocab_size, (1, a.tokens), generator=torch.Generator().manual_seed(0))
    ours_s, ours = timed(lambda: lm.forward(tokens, lm.init_state(1))[0], a.repeats)
    with torch.inference_mode():
        theirs_s, theirs = timed(lambda: ref(input_ids=tokens, use_cache=False).logits, a.repeats)
    diff = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    result = {
        "model": str(a.model), "tokens": a.tokens, "threads": 1, "dtype": "float32",
        "megaeval_tokens_per_second": round(a.tokens / ours_s, 1),
        "transformers_tokens_per_second": round(a.tokens / theirs_s, 1),
        "speedup": round(theirs_s / ours_s, 2), "max_abs_logit_diff_over_max_logit": diff,
    }  # fmt: skip
    if diff > 1e-4:
        raise SystemExit(f"logits disagree: {diff:.2e} relative to the largest logit")
    return result


FAMILIES = {  # transformers config class, causal LM class, fields of the zoo's size
    "mamba": ("MambaConfig", "MambaForCausalLM", SIZE),
    "recurrent_gemma": ("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM",
                        dict(vocab_size=4096, hidden_size=128, lru_width=128, num_hidden_layers=6,
                             num_attention_heads=4, num_key_value_heads=1, head_dim=32, intermediate_size=384,
                             attention_window_size=2048, conv1d_width=4)),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM",
               dict(vocab_size=4096, hidden_size=128, state_size=16, num_hidden_layers=6, expand=2, conv_kernel=4,
                    head_dim=32, num_heads=8, n_groups=1, chunk_size=16)),
    "rwkv": ("RwkvConfig", "RwkvForCausalLM",
             dict(vocab_size=4096, hidden_size=128, num_hidden_layers=6, attention_hidden_size=128,
                  intermediate_size=512, context_length=4096)),
}  # fmt: skip


def random_family(folder: Path, family: str) -> Path:
    """A random model of `family` at the zoo's size, saved by transformers with the zoo's tokenizer (made once)."""
    import shutil

    import transformers

    if not (folder / "config.json").exists():
        config_name, model_name, fields = FAMILIES[family]
        torch.manual_seed(0)
        config = getattr(transformers, config_name)(**fields, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        getattr(transformers, model_name)(config).save_pretrained(folder)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(ZOO_TOKENIZER / name, folder / name)
    return folder


def doubling_scan(a, b, h0, overwrite=False):
    """The previous scan (Hillis-Steele: log2(T) in-place passes), for the comparison only."""
    a, b = torch.broadcast_tensors(a, b)
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), h0.dtype)
    a, b = a.to(dtype).clone(), b.to(dtype).clone()
    b[:, 0].addcmul_(a[:, 0], h0.to(dtype))
    k = 1
    while k < a.shape[1]:
        b[:, k:].addcmul_(a[:, k:], b[:, :-k].clone())
        a[:, k:].mul_(a[:, :-k].clone())
        k *= 2
    return b, b[:, -1]


def scan_speeds(a: argparse.Namespace) -> dict:
    """tokens/s of one call per family and length: blocked scan, previous scan, transformers."""
    import transformers

    from megaeval import load_model

    torch.set_num_threads(1)
    rows = []
    for family in a.families.split(","):
        folder = random_family(a.work / family, family)
        lm = load_model(str(folder), dtype="float32")
        chunk = lm.model.chunk
        ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        for n in (int(x) for x in a.lengths.split(",")):
            tokens = torch.randint(3, 4096, (1, n), generator=torch.Generator().manual_seed(0))
            row: dict = {"family": family, "tokens": n}
            runs = {
                "blocked": lambda lm=lm, t=tokens: lm.forward(t, lm.init_state(1))[0],
                "previous": lambda lm=lm, t=tokens, c=chunk: _previous(
                    lm, c, lambda: lm.forward(t, lm.init_state(1))[0]
                ),
            }
            if n <= 4096:  # transformers' paths loop over tokens: longer calls take minutes
                runs["transformers"] = lambda r=ref, t=tokens: r(input_ids=t, use_cache=False).logits
            best, outs = dict.fromkeys(runs, float("inf")), {}
            for _ in range(a.repeats):  # the variants in turn, each repeat: the machine's drift hits them alike
                for name, run in runs.items():
                    with torch.inference_mode():
                        seconds, outs[name] = timed(run, 1)
                    best[name] = min(best[name], seconds)
            for name, seconds in best.items():
                row[f"{name}_tokens_per_second"] = round(n / seconds, 1)
            if "transformers" in outs:
                theirs = outs["transformers"]
                row["max_abs_logit_diff_over_max_logit"] = ((outs["blocked"] - theirs).abs().max() / theirs.abs().max()
                                                            ).item()  # fmt: skip
                row["speedup_vs_transformers"] = round(best["transformers"] / best["blocked"], 2)
            row["speedup_vs_previous"] = round(row["blocked_tokens_per_second"] / row["previous_tokens_per_second"], 2)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return {"threads": 1, "dtype": "float32", "rows": rows}


def _previous(lm, chunk: int, run):
    """`run` with the previous scan: every caller's `scan.scan` runs the doubling scan's code, Mamba-1 in chunks of
    16 and RecurrentGemma's RG-LRU chunk by chunk, as before."""
    from megaeval.models.recurrent import recurrent_gemma, scan

    blocked, forward = scan.scan.__code__, recurrent_gemma.RGLRU.forward
    scan.scan.__code__, lm.model.chunk = doubling_scan.__code__, 16
    recurrent_gemma.RGLRU.forward = _rg_in_chunks(forward, scan.scan)
    try:
        return run()
    finally:
        scan.scan.__code__, lm.model.chunk, recurrent_gemma.RGLRU.forward = blocked, chunk, forward


def _rg_in_chunks(forward, scan_fn):
    """RecurrentGemma's RG-LRU as it was: the scan over chunks of 16 tokens."""

    def chunked(self, x, h0, position, _scan):
        def in_chunks(a, b, h):
            outs = []
            for s in range(0, a.shape[1], 16):
                hs, h = scan_fn(a[:, s : s + 16], b[:, s : s + 16], h)
                outs.append(hs)
            return torch.cat(outs, 1), h

        return forward(self, x, h0, position, in_chunks)

    return chunked


def memory(a: argparse.Namespace) -> dict:
    work = a.work
    model = str(a.model or random_mamba(work / "mamba"))
    stream = work / "austen-mamba"
    run = [sys.executable, "-m", "megaeval"]
    if not (stream / "manifest.json").exists():
        subprocess.run([*run, "prep-books", str(REPO / "data_prep/corpora/austen"), "--model", model,
                        "--out", str(stream), "--no-progress"], check=True, stdout=sys.stderr)  # fmt: skip
    out = work / "sweep_mamba.json"
    subprocess.run([*run, "ppl-sweep", "--model", model, "--stream", str(stream), "--lengths",
                    a.lengths, "--tokens", a.lengths.split(",")[-1], "--batch-size", "1", "--out", str(out),
                    "--no-progress"], check=True, stdout=sys.stderr)  # fmt: skip
    rows = json.loads(out.read_text())["results"]["lengths"]
    keep = [{k: r[k] for k in ("context_length", "tokens_per_second", "peak_memory_bytes", "ppl")} for r in rows]
    ratio = rows[-1]["peak_memory_bytes"] / rows[0]["peak_memory_bytes"]
    return {"rows": keep, "memory_longest_vs_shortest": round(ratio, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["speed", "memory", "scan"])
    parser.add_argument("--model", type=Path, default=None, help="a Mamba checkpoint directory")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--lengths", default=None, help="memory: 4K,...,256K; scan: 4096,65536")
    parser.add_argument("--families", default="mamba,recurrent_gemma,mamba2,rwkv")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "megaeval-bench-recurrent")
    a = parser.parse_args()
    if a.lengths is None:
        a.lengths = "4096,65536" if a.what == "scan" else "4K,8K,16K,32K,64K,128K,256K"
    run = {"speed": speed, "memory": memory, "scan": scan_speeds}[a.what]
    print(json.dumps(run(a), indent=1))


if __name__ == "__main__":
    main()
