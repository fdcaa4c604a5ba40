"""Run THUDM/LongBench's own prediction code on the fixtures of tests/fixtures/longbench and record what it builds:
write tests/fixtures/longbench/official_prompts.json.gz, the expected values of
tests/tasks/longbench/test_official_prompts.py.

v1: LongBench/pred.py `get_pred`, as is, with a fake model that records what `generate` gets (and answers a few
fixed tokens), real transformers tokenizers, and only what needs a GPU or a model replaced (stub modules for
`llama_flash_attn_monkey_patch`, `load_model_and_tokenizer`, `dist.destroy_process_group`, BatchEncoding `.to`).
`build_chat` is wrapped to record the prompt it gets (the truncated prompt, before any chat format) and return it.
v2: the root pred.py `get_pred`, as is, with stub `openai` (a client that records each request and answers canned
outputs) and `tiktoken` modules, and `model_map`/`maxlen_map` naming the fixture tokenizers and small lengths.

Two tokenizers: megaeval/assets/transformer-tiny (Unigram with byte fallback, no BOS) and
tests/fixtures/longbench/tokenizer-bpe-bos (byte-level BPE, BOS first; made by tests/fixtures/longbench/make_data.py).
A transformers copy of megalodon-tiny's sentencepiece model is only compared with megaeval's sentencepiece tokenizer
(`sentencepiece_check`, recorded in the header): they decode some cut texts differently, so it gives no expected values.

Usage (the project's venv, with transformers): .venv/bin/python data_prep/longbench/official_prompts.py LONGBENCH_DIR
where LONGBENCH_DIR is a work tree of THUDM/LongBench at COMMIT."""

from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "longbench"
COMMIT = "2e00731f8d0bff23dc4325161044d0ed8af94c1e"
MODEL = "fixture-model"  # no "chatglm", "xgen", "internlm": pred.py's model-specific branches stay off
V1_MAX_LENGTHS = (301, 512)  # odd and even; the fixtures' short prompts fit in 512, the long ones do not
V2_MAX_LENGTHS = (301, 1000)
RAW = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")  # pred.py: no chat format on these
REPLY = "Paragraph 2\nSummary"  # what the fake model answers (its tokens, then EOS)

# v2's canned model outputs, per mode and item: one per query (--cot: the reasoning, then the answer)
V2_CANNED = {
    "0shot": [["The correct answer is (B)"], ["**The correct answer is C**"], ["The correct answer is (A) or (B)"],
              ["I think B"], [""], ["The correct answer is (*A*)"],
              ["  The correct answer is C.\n\nMarion offered to draft it.  "], ["the correct answer is (c)"]],
    "no_context": [["The correct answer is B"], ["The correct answer is (E)"],
                   ["The correct answer is (D). Wait, the correct answer is (A)"], [""],
                   ["The correct answer is **(C)**"], ["The correct answer is: A"], ["The correct answer is (B)"],
                   ["The correct answer is Dover"]],
    "cot": [["  Sir Walter reads only the Baronetage.  \n", "The correct answer is (B)"], [""],
            ["Both documents say who wrote the letters.", ""],
            ["Step 1: North has 410 loans.\nStep 2: that is the most.", "**The correct answer is (C)**"],
            ["It adds the copies.", "The correct answer is C"],
            ["Oslo is a city; the text says $Q$ and $C_A$ literally.", "The correct answer is (A)"],
            ["Marion will draft the handout.", "I think the correct answer is (C) or maybe (D)"],
            ["The first paragraph names Sussex.", "\nThe correct answer is (C)\n"]],
}  # fmt: skip


def tokenizer_dirs() -> dict[str, Path]:
    """The two tokenizer folders the official code reads (`AutoTokenizer.from_pretrained`)."""
    return {"transformer-tiny": ROOT / "megaeval" / "assets" / "transformer-tiny",
            "bpe-bos": FIXTURES / "tokenizer-bpe-bos"}  # fmt: skip


def megalodon_transformers(tmp: Path) -> Path:
    """megalodon-tiny's tokenizer as a transformers folder: transformer-tiny's tokenizer.json (the Unigram model of
    megalodon-tiny's tokenizer.model, id for id) with a post-processor that puts BOS (<s>, id 1) first."""
    import sentencepiece as spm

    tiny = ROOT / "megaeval" / "assets" / "transformer-tiny"
    spec = json.loads((tiny / "tokenizer.json").read_text(encoding="utf-8"))
    first = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [first, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [first, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    (tmp / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (tmp / "tokenizer_config.json").write_bytes((tiny / "tokenizer_config.json").read_bytes())
    sp = spm.SentencePieceProcessor(model_file=str(ROOT / "megaeval/assets/megalodon-tiny/tokenizer.model"))
    vocab = AutoTokenizer.from_pretrained(tmp).get_vocab()
    assert len(vocab) == sp.get_piece_size() and all(vocab[sp.id_to_piece(i)] == i for i in range(len(vocab)))
    return tmp


def sentencepiece_check(templates: dict[str, str]) -> dict[str, Any]:
    """Whether megaeval's sentencepiece tokenizer of megalodon-tiny encodes (BOS first) every v1 fixture prompt, and
    decodes every half pred.py keeps of it (V1_MAX_LENGTHS), as the same vocabulary in transformers does. It does not
    on halves cut inside a run of byte-fallback tokens (Chinese text here): sentencepiece replaces only the bytes
    that make no character, transformers' ByteFallback decoder every byte of the run. So that tokenizer is not used
    for the expected values; what was found is recorded in the header."""
    sys.path.insert(0, str(ROOT))
    from megaeval.tokenizers import SentencePieceTokenizer

    sp = SentencePieceTokenizer(ROOT / "megaeval/assets/megalodon-tiny/tokenizer.model")
    found = {"prompts": 0, "encodings_differ": 0, "halves": 0, "decodings_differ": 0, "files_differing": []}
    with tempfile.TemporaryDirectory() as tmp:
        hf = AutoTokenizer.from_pretrained(megalodon_transformers(Path(tmp)))
        for file in sorted((FIXTURES / "v1" / "data").glob("*.jsonl")):
            for line in file.read_text(encoding="utf-8").splitlines():
                text = templates[file.stem.removesuffix("_e")].format(**json.loads(line))
                ids = hf(text).input_ids
                found["prompts"] += 1
                found["encodings_differ"] += sp.encode_offsets(text, specials=True)[0] != ids
                for max_length in V1_MAX_LENGTHS:
                    half = int(max_length / 2)
                    for part in (ids[:half], ids[-half:]) if len(ids) > max_length else ():
                        found["halves"] += 1
                        if sp.decode(part) != hf.decode(part, skip_special_tokens=True):
                            found["decodings_differ"] += 1
                            found["files_differing"] = sorted({*found["files_differing"], file.stem})
    return found


class Texts:
    """Each distinct text (or id list) stored once in the output; cases refer to it by index."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.index: dict[str, int] = {}

    def __call__(self, value: Any) -> int:
        key = json.dumps(value, ensure_ascii=False)
        if key not in self.index:
            self.index[key] = len(self.items)
            self.items.append(value)
        return self.index[key]


@contextlib.contextmanager
def stub_modules(**modules: types.ModuleType):
    """Modules put in sys.modules for an import, and taken out after."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def import_file(name: str, path: Path, cwd: Path, **stubs: types.ModuleType) -> types.ModuleType:
    """Import a script as module `name` (from `cwd`, where it reads its config files at import)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    old = Path.cwd()
    with stub_modules(**stubs):
        os.chdir(cwd)
        try:
            spec.loader.exec_module(module)
        finally:
            os.chdir(old)
    return module


def module(name: str, **attrs: Any) -> types.ModuleType:
    """A stand-in module holding `attrs`."""
    mod = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


def recording(tokenizer: Any, calls: list[str]) -> Any:
    """The tokenizer, its class extended so that each `tokenizer(text, return_tensors="pt")` call records `text`."""
    base = type(tokenizer)

    def __call__(self, text, *args, **kwargs):  # noqa: N807
        if kwargs.get("return_tensors") == "pt":
            calls.append(text)
        return base.__call__(self, text, *args, **kwargs)

    tokenizer.__class__ = type(f"Recording{base.__name__}", (base,), {"__call__": __call__})
    return tokenizer


class FakeModel:
    """Records each `generate` call and answers its input followed by `reply`."""

    def __init__(self, reply: list[int], events: list[dict]):
        self.reply = reply
        self.events = events

    def generate(self, **kwargs: Any) -> torch.Tensor:
        """The input ids followed by the reply; the call's ids and keyword arguments recorded."""
        ids = kwargs.pop("input_ids")
        kwargs.pop("attention_mask", None)
        self.events.append({"input_ids": ids[0].tolist(), "kwargs": kwargs})
        return torch.cat([ids, torch.tensor([self.reply], dtype=ids.dtype)], dim=1)


def run_v1(root: Path, dirs: dict[str, Path], texts: Texts) -> dict[str, Any]:
    """LongBench/pred.py get_pred on every v1 fixture file, per tokenizer and max_length."""
    base = root / "LongBench"
    flash = module("llama_flash_attn_monkey_patch", replace_llama_attn_with_flash_attn=lambda: None)
    pred = import_file("longbench_v1_pred", base / "pred.py", base, llama_flash_attn_monkey_patch=flash)
    prompts = json.loads((base / "config/dataset2prompt.json").read_text(encoding="utf-8"))
    budgets = json.loads((base / "config/dataset2maxlen.json").read_text(encoding="utf-8"))
    transformers.BatchEncoding.to = lambda self, device: self  # no CUDA here: inputs stay on the CPU
    pred.dist = module("dist", destroy_process_group=lambda: None)
    pred.tqdm = lambda data: data
    state: dict[str, Any] = {}
    real_build_chat = pred.build_chat

    def build_chat(tokenizer, prompt, model_name):
        state["chat"].append(prompt)
        assert real_build_chat(tokenizer, prompt, model_name) == prompt  # no chat format for this model name
        return prompt

    def load_model_and_tokenizer(path, model_name, device):
        tokenizer = recording(AutoTokenizer.from_pretrained(path), state["calls"])
        reply = tokenizer(REPLY, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        return FakeModel(reply, state["events"]), tokenizer

    pred.build_chat = build_chat
    pred.load_model_and_tokenizer = load_model_and_tokenizer
    cases = []
    for name, path in dirs.items():
        counter = AutoTokenizer.from_pretrained(path)
        for file in sorted((FIXTURES / "v1" / "data").glob("*.jsonl")):
            records = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]
            task = file.stem.removesuffix("_e")
            runs = [(length, list(range(len(records)))) for length in V1_MAX_LENGTHS]
            if not file.stem.endswith("_e"):  # at the edge: the prompt's own token count, and one less
                n = len(counter(prompts[task].format(**records[0])).input_ids)
                runs += [(n, [0]), (n - 1, [0])]
            for max_length, picked in runs:
                state.update(calls=[], chat=[], events=[])
                with tempfile.TemporaryDirectory() as out:
                    out_path = Path(out) / "pred.jsonl"
                    pred.get_pred(0, 1, [records[i] for i in picked], max_length, budgets[task], prompts[task], task,
                                  "cpu", MODEL, {MODEL: str(path)}, str(out_path))  # fmt: skip
                    lines = [json.loads(line) for line in out_path.read_text(encoding="utf-8").splitlines()]
                assert len(state["events"]) == len(lines) == len(picked) and len(state["calls"]) == 2 * len(picked)
                assert state["chat"] == ([] if task in RAW else state["calls"][1::2])
                for k, i in enumerate(picked):
                    full, final = state["calls"][2 * k], state["calls"][2 * k + 1]
                    event = state["events"][k]
                    case = {"tokenizer": name, "file": file.stem, "task": task, "index": i, "max_length": max_length,
                            "prompt_tokens": len(counter(full).input_ids), "prompt": texts(final),
                            "generate": {key: value for key, value in sorted(event["kwargs"].items())},
                            "line": lines[k]}  # fmt: skip
                    if task in RAW:
                        case["input_ids"] = texts(event["input_ids"])
                    else:
                        case["input_tokens"] = len(event["input_ids"])
                    cases.append(case)
    return {"max_lengths": list(V1_MAX_LENGTHS), "model_name": MODEL, "reply": REPLY, "templates": prompts,
            "budgets": budgets, "cases": cases}  # fmt: skip


class FakeClient:
    """openai.OpenAI stand-in: records each chat request and answers the current item's next canned output."""

    def __init__(self, state: dict[str, Any], **_: Any):
        self.state = state
        self.chat = types.SimpleNamespace(completions=self)

    def create(self, *, model: str, messages: list[dict], temperature: float, max_tokens: int) -> Any:
        """Record the request; answer the current item's next canned output."""
        item = self.state["item"]
        queue = self.state["canned"][item]
        self.state["queries"].append({"item": item, "model": model, "messages": messages, "temperature": temperature,
                                      "max_tokens": max_tokens})  # fmt: skip
        message = types.SimpleNamespace(content=queue.pop(0))
        return types.SimpleNamespace(choices=[types.SimpleNamespace(message=message)])


def run_v2(root: Path, dirs: dict[str, Path], texts: Texts) -> dict[str, Any]:
    """The root pred.py get_pred on v2/data.json: plain, --cot and --no_context, per tokenizer and max length."""
    state: dict[str, Any] = {}

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("tiktoken is for OpenAI models only")

    pred = import_file("longbench_v2_pred", root / "pred.py", root,
                       openai=module("openai", OpenAI=lambda **kw: FakeClient(state, **kw)),
                       tiktoken=module("tiktoken", encoding_for_model=refuse))  # fmt: skip

    def items(data):
        for i, item in enumerate(data):
            state["item"] = i
            yield item

    pred.tqdm = items
    data = json.loads((FIXTURES / "v2" / "data.json").read_text(encoding="utf-8"))
    pred.model_map, pred.maxlen_map = {}, {}
    cases = []
    for name, path in dirs.items():
        for max_len in V2_MAX_LENGTHS:
            model = f"{name}-{max_len}"
            assert "gpt" not in model and "o1" not in model  # pred.py would take tiktoken's tokenizer
            pred.model_map[model], pred.maxlen_map[model] = str(path), max_len
            for mode, canned in V2_CANNED.items():
                state.update(canned=copy.deepcopy(canned), queries=[])
                args = argparse.Namespace(model=model, cot=mode == "cot", no_context=mode == "no_context", rag=0)
                mutated = copy.deepcopy(data)
                fout = io.StringIO()
                pred.get_pred(mutated, args, fout)
                assert all(not q for q in state["canned"]), "a canned output was not asked for"
                queries = []
                for q in state["queries"]:
                    assert q["model"] == str(path) and len(q["messages"]) == 1 and q["messages"][0]["role"] == "user"
                    first = not any(p["item"] == q["item"] for p in queries)
                    template = {"0shot": "0shot", "no_context": "0shot_no_context"}.get(mode) or (
                        "0shot_cot" if first else "0shot_cot_ans")  # fmt: skip
                    entry = {"item": q["item"], "template": template, "content": texts(q["messages"][0]["content"]),
                             "temperature": q["temperature"], "max_tokens": q["max_tokens"]}  # fmt: skip
                    if template == "0shot_cot_ans":
                        entry["cot"] = mutated[q["item"]]["response_cot"]
                    queries.append(entry)
                lines = []
                for line in fout.getvalue().splitlines():
                    row = json.loads(line)
                    item = next(i for i, it in enumerate(data) if it["_id"] == row["_id"])
                    assert row.pop("context") == data[item]["context"][:1000]  # (left out: the context's start)
                    lines.append({"item": item, **{k: v for k, v in row.items() if k not in data[item]}})
                cases.append({"tokenizer": name, "max_length": max_len, "mode": mode, "queries": queries,
                              "lines": lines})  # fmt: skip
    templates = {n: (root / "prompts" / f"{n}.txt").read_text(encoding="utf-8")
                 for n in ("0shot", "0shot_cot", "0shot_cot_ans", "0shot_no_context")}  # fmt: skip
    return {"max_lengths": list(V2_MAX_LENGTHS), "canned": V2_CANNED, "templates": templates, "cases": cases}


def main() -> None:
    """Run both versions and write the expected-values file."""
    root = Path(sys.argv[1]).resolve()
    texts = Texts()
    dirs = tokenizer_dirs()
    v1 = run_v1(root, dirs, texts)
    v2 = run_v2(root, dirs, texts)
    sentencepiece = sentencepiece_check(v1["templates"])
    files = sorted((FIXTURES / "v1" / "data").glob("*.jsonl")) + [FIXTURES / "v2" / "data.json"]
    data_sha = {p.relative_to(FIXTURES).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    header = {
        "repo": "https://github.com/THUDM/LongBench",
        "commit": COMMIT,
        "licence": "MIT, Copyright (c) 2023 THU-KEG & Zhipu AI (the code run; its outputs are recorded here)",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "generated_by": "data_prep/longbench/official_prompts.py LONGBENCH_DIR (see its docstring for what is "
                        "replaced: stub modules, a recording fake model, a recording openai client)",
        "tokenizers": {"transformer-tiny": "megaeval/assets/transformer-tiny (Unigram, byte fallback, no BOS)",
                       "bpe-bos": "tests/fixtures/longbench/tokenizer-bpe-bos (byte-level BPE, BOS first)"},
        "megalodon_sentencepiece_check": sentencepiece,
        "texts": "`prompt`, `input_ids` and `content` are indexes into `texts`",
        "fixtures_sha256": data_sha,
    }  # fmt: skip
    out = {"header": header, "v1": v1, "v2": v2, "texts": texts.items}
    path = FIXTURES / "official_prompts.json.gz"
    text = json.dumps(out, ensure_ascii=False, indent=1)
    text = re.sub(r"\[[\d,\s]+\]", lambda m: "[" + ",".join(m.group(0)[1:-1].split()).replace(",,", ",") + "]", text)
    path.write_bytes(gzip.compress((text + "\n").encode("utf-8"), compresslevel=9, mtime=0))  # same bytes each run
    print(f"wrote {path}: {len(v1['cases'])} v1 cases, {len(v2['cases'])} v2 runs, {len(texts.items)} texts")


if __name__ == "__main__":
    main()
