"""Run BABILong's own code (booydar/babilong) offline on small inputs, to get the reference outputs that megaeval's
BABILong must equal. A developer tool: megaeval never calls it.

    python -m megaeval.data_prep.babilong_reference --out tests/fixtures/babilong/reference

BABILong's code needs pandas < 3 (pandas 3 reads its `None` answers as NaN) and, for its chat path, transformers 4
(whose `apply_chat_template` returns a tensor), so run this in an environment with pandas 2, transformers 4, torch and
nltk (the files in tests/fixtures/babilong/reference: pandas 2.3.3, numpy 2.4.6, transformers 4.57.6, nltk 3.10.4).
It takes BABILong's `babilong/` and `scripts/` folders at the pinned commit from a git directory (--babilong, default
the mirror at BABILONG_GIT) and writes, under --out:

- prompts.json: `get_formatted_input` with `DEFAULT_PROMPTS` and `DEFAULT_TEMPLATE` for every task, for the eight
  combinations of the instruction, examples and post-prompt flags, on hand-made contexts and questions;
- pipeline/: `scripts/run_model_on_babilong.py`'s `main` run whole on the frozen-layout fixture (tasks qa1-qa5, its
  lengths), with megaeval's embedded transformer-tiny tokenizer (a chat template added: TEMPLATE), plain and with
  --use_chat_template, its model replaced by a stand-in whose `generate` records the prompt's ids and answers with
  canned texts (`canned`): inputs.json (the ids per task, length and instance) and the official prediction files it
  wrote (`<prompt_name>/` folders);
- scores.json: `metrics.compare_answers` on a table of hand-made answers covering every rule;
- collect_results.json: `collect_results.get_model_results` (its plotting imports stubbed) on the official
  prediction files copied into tests/fixtures/babilong/predictions/ (Phi-3-mini and Gemini 3 Flash, from the
  repository's babilong_evals/);
- generator.json: `TaskDataset`, `SentenceSampler` and `NoiseInjectionDataset` with seeds, as create_tasks drives
  them, on the fixture's bAbI files and two Austen novels (and books/spaced.txt, prose with a space before its
  punctuation), with GPT-2's tokenizer (megaeval's shipped copy), decoded plain and with transformers' clean-up of
  spaces before punctuation (on by default in transformers 4.x, which made the published sets).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

PARTS = ("instruction", "examples", "post_prompt")
BABILONG_COMMIT = "7a6efee29f5cac03c3c410e6799c80fd2ffe3610"
BABILONG_GIT = os.environ.get("BABILONG_GIT", "/work/.mirror/booydar+babilong/repo")
REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "babilong"
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")  # fmt: skip
CONTEXTS = [("Mary went to the kitchen. Some text. John moved to the garden.", "Where is Mary?"),
            ("  \n Leading and trailing whitespace {with braces} is stripped.\n\n", "Is it? ")]  # fmt: skip
# (task, target, output, question): every rule of compare_answers
SCORE_CASES = [
    ("qa1", "hallway", "The most recent location of John is hallway.", "Where is John? "),
    ("qa1", "hallway", "hallway, then the kitchen", "Where is John? "),
    ("qa1", "hallway", "Hallway. Then the kitchen.", "Where is John? "),
    ("qa1", "kitchen", "It is the garden.Then kitchen", "Where is John? "),
    ("qa1", "bathroom", "bathroom <context> kitchen", "Where is Mary? "),
    ("qa1", "bathroom", "bathroom <example> kitchen", "Where is Mary? "),
    ("qa1", "bathroom", "bathroom Question: kitchen", "Where is Mary? "),
    ("qa1", "bathroom", "", "Where is Mary? "),
    ("qa1", "bathroom", "None", "Where is Mary? "),
    ("qa2", "kitchen", "The football is in the kitchen.", "Where is the football? "),
    ("qa3", "bathroom", "Before the kitchen the apple was in the bathroom.", "Where was the apple before the kitchen?"),
    ("qa3", "kitchen", "Before the kitchen the apple was in the kitchen.", "Where was the apple before the kitchen?"),
    ("qa4", "bedroom", "bedroom and hallway", "What is the bathroom east of?"),
    ("qa4", "bedroom", "bedrooms", "What is the bathroom east of?"),
    ("qa5", "Jeff", "jeff", "Who received the football?"),
    ("qa5", "milk", "Mary gave the milk", "What did Mary give to Bill?"),
    ("qa6", "yes", "Yes, he is.", "Is John in the garden?"),
    ("qa6", "no", "yes or no", "Is John in the garden?"),
    ("qa7", "two", "two objects", "How many objects is Mary carrying?"),
    ("qa7", "none", "none", "How many objects is Mary carrying?"),
    ("qa8", "apple,milk", "apple,milk", "What is Daniel carrying?"),
    ("qa8", "apple,milk", "milk, apple", "What is Daniel carrying?"),
    ("qa8", "apple,milk", "apple", "What is Daniel carrying?"),
    ("qa8", "apple,milk", "apple, milk and football", "What is Daniel carrying?"),
    ("qa8", "nothing", "nothing", "What is Mary carrying?"),
    ("qa10", "maybe", "maybe", "Is Bill in the park?"),
    ("qa14", "park", "In the park.", "Where was Fred before the school?"),
    ("qa15", "wolf", "wolves", "What is Gertrude afraid of?"),
    ("qa16", "gray", "gray", "What color is Greg?"),
    ("qa17", "yes", "yes", "Is the red square to the left of the blue square?"),
    ("qa18", "no", "no", "Does the box fit in the chest?"),
    ("qa19", "n,w", "n,w", "How do you go from the kitchen to the hallway?"),
    ("qa19", "s,e", "n,e", "How do you go from the kitchen to the garden?"),
    ("qa19", "s,e", "s,e s,w", "How do you go from the kitchen to the garden?"),
    ("qa20", "hungry", "He is hungry.", "Why did Yann go to the kitchen?"),
    ("qa20", "kitchen", "kitchen", "Where will Sumit go?"),
]  # fmt: skip


def canned(i: int, target: str) -> str:
    """The stand-in model's answer to instance i: right, wrong, empty, padded or with a second sentence (at most 20
    bytes: a byte-level model spells it within BABILong's 20 new tokens)."""
    return [f"It is {target}.", "I do not know.", "", f"  {target}  ", f"{target}. Question"][i % 5]


def official_code(git_dir: str, commit: str, into: Path) -> Path:
    """BABILong's babilong/ and scripts/ folders at `commit`, extracted from the git directory `git_dir`."""
    data = subprocess.run(["git", "-C", git_dir, "archive", commit, "babilong", "scripts"], check=True,
                          capture_output=True).stdout  # fmt: skip
    tarfile.open(fileobj=io.BytesIO(data)).extractall(into, filter="data")
    return into


def prompts(out: Path) -> None:
    from babilong.prompts import DEFAULT_PROMPTS, DEFAULT_TEMPLATE, get_formatted_input

    found = {}
    for task, cfg in DEFAULT_PROMPTS.items():
        for mask in range(8):
            use = [bool(mask & 4), bool(mask & 2), bool(mask & 1)]
            parts = {k: cfg[k] if on else "" for k, on in zip(PARTS, use, strict=True)}
            name = "_".join(f"{k}_{'yes' if v else 'no'}" for k, v in parts.items())
            found.setdefault(task, {})[name] = [
                get_formatted_input(c, q, parts["examples"], parts["instruction"], parts["post_prompt"],
                                    template=DEFAULT_TEMPLATE) for c, q in CONTEXTS]  # fmt: skip
    (out / "prompts.json").write_text(json.dumps({"contexts": CONTEXTS, "prompts": found}, indent=1))


def pipeline(out: Path, frozen: Path, tasks: list[str], lengths: list[str]) -> None:
    """run_model_on_babilong.main on the fixture, with a stand-in model and the fixture tokenizer."""
    import datasets
    import torch
    import transformers

    tok_dir = Path(tempfile.mkdtemp())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        text = (REPO / "megaeval" / "assets" / "transformer-tiny" / name).read_text()
        if name == "tokenizer_config.json":
            # the same tokenizer.json under a class name transformers 4 knows too
            text = json.dumps(
                {**json.loads(text), "chat_template": TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}
            )
        (tok_dir / name).write_text(text)
    recorded: dict[str, list] = {}
    current: dict[str, str] = {}

    class StandIn(torch.nn.Module):
        name_or_path = "stand-in"
        device = torch.device("cpu")

        def eval(self):
            return self

        def generate(self, input_ids, **kwargs):
            key = f"{current['chat']}/{current['task']}/{current['length']}"
            recorded.setdefault(key, []).append(input_ids[0].tolist())
            i = len(recorded[key]) - 1
            target = instances[current["task"], current["length"]][i]["target"]
            answer = tok(canned(i, target), add_special_tokens=False, return_tensors="pt")["input_ids"]
            return torch.cat([input_ids, answer, torch.tensor([[tok.eos_token_id or 0]])], 1)

    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    instances = {(t, n): json.loads((frozen / t / f"{n}.json").read_text()) for t in tasks for n in lengths}

    def load_dataset(name, config, **kwargs):
        current["length"] = config
        return _Tracked({t: instances[t, config] for t in tasks}, current)

    transformers.AutoModelForCausalLM.from_pretrained = staticmethod(lambda *a, **k: StandIn())
    datasets.load_dataset = load_dataset
    sys.path.insert(0, str(Path(sys.modules["babilong"].__file__).parents[1] / "scripts"))
    import run_model_on_babilong as script

    script.AutoModelForCausalLM.from_pretrained = transformers.AutoModelForCausalLM.from_pretrained
    script.datasets.load_dataset = load_dataset
    for chat in (False, True):
        current["chat"] = "chat" if chat else "plain"
        script.main(str(out / "pipeline"), "model", str(tok_dir), None, None, tasks, lengths, "fixture", chat, "",
                    True, True, True, "", False, False)  # fmt: skip
    (out / "pipeline" / "inputs.json").write_text(json.dumps(recorded))
    (out / "pipeline" / "TEMPLATE.jinja").write_text(TEMPLATE)


class _Tracked(dict):
    """The stand-in for `datasets.load_dataset(...)`: the fixture's instances, noting the task read."""

    def __init__(self, data: dict, current: dict):
        super().__init__(data)
        self.current = current

    def __getitem__(self, task):
        self.current["task"] = task
        return super().__getitem__(task)


def scores(out: Path) -> None:
    from babilong.metrics import TASK_LABELS, compare_answers

    rows = [[t, target, output, q, bool(compare_answers(target, output, q, TASK_LABELS[t]))]
            for t, target, output, q in SCORE_CASES]  # fmt: skip
    (out / "scores.json").write_text(json.dumps(rows, indent=1))


def collect(out: Path) -> None:
    for name in ("matplotlib", "matplotlib.pyplot", "matplotlib.colors", "seaborn", "IPython", "IPython.display"):
        try:
            __import__(name)
        except ImportError:  # plotting and display only: stand-ins that do nothing
            module = sys.modules.setdefault(name, types.ModuleType(name))
            for attr in ("rc", "LinearSegmentedColormap", "display"):
                setattr(module, attr, lambda *a, **k: None)
    from babilong.collect_results import get_model_results

    found = {}
    for model in sorted(p for p in (FIXTURES / "predictions").glob("*/*") if p.is_dir()):
        results, tasks, lengths = get_model_results(model)
        found[f"{model.parent.name}/{model.name}"] = {
            cfg: {"tasks": tasks, "lengths": lengths, "accuracy": acc.tolist()} for cfg, acc in results.items()
        }
    (out / "collect_results.json").write_text(json.dumps(found, indent=1))


def generator(out: Path) -> None:
    import torch
    from babilong.babilong_utils import NoiseInjectionDataset, SentenceSampler, TaskDataset

    from megaeval.tasks.babilong.tokenizer import length_tokenizer

    shelves = {"austen": [(REPO / "data_prep" / "corpora" / "austen" / f).read_text()
                          for f in ("emma.txt", "persuasion.txt")],
               "spaced": [(FIXTURES / "books" / "spaced.txt").read_text()]}  # fmt: skip
    cases = [("austen", "qa1_single-supporting-fact", [0, 1000, 2000], 4, 7),
             ("austen", "qa2_two-supporting-facts", [0, 1000], 3, 42), ("austen", "qa8_lists-sets", [0, 1000], 3, 3),
             ("spaced", "qa1_single-supporting-fact", [1000], 3, 11)]  # fmt: skip
    found = {}
    for clean_up in (False, True):
        tok = length_tokenizer("gpt2")
        tok.clean_up_tokenization_spaces = clean_up
        tok.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = clean_up
        for shelf, babi, lengths, n, seed in cases:
            books = [{"text": text} for text in shelves[shelf]]
            path = FIXTURES / "babi" / f"{babi}_test.txt"
            for length in lengths:
                size = length - 300
                task = TaskDataset(str(path), max_n_facts=size // 8) if size > 0 else TaskDataset(str(path))
                sampler = SentenceSampler(books, tokenizer=tok, shuffle=True, random_seed=seed)
                data = NoiseInjectionDataset(task_dataset=task, noise_sampler=sampler, tokenizer=tok,
                                             sample_size=size, random_seed=seed)  # fmt: skip
                samples = [data[i] for i in range(n)]
                inputs = tok.batch_decode([torch.tensor(s["input_tokens"]) for s in samples])
                targets = tok.batch_decode([torch.tensor(s["target_tokens"]) for s in samples])
                found[f"{'clean' if clean_up else 'plain'}/{shelf}/{babi}/{length}/{n}/{seed}"] = [
                    {"input": i.strip(), "question": s["question"], "target": t}
                    for i, s, t in zip(inputs, samples, targets, strict=True)]  # fmt: skip
    (out / "generator.json").write_text(json.dumps(found, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--babilong", default=BABILONG_GIT, help="a git directory of booydar/babilong")
    parser.add_argument("--commit", default=BABILONG_COMMIT)
    parser.add_argument("--frozen", default=str(FIXTURES / "frozen"))
    args = parser.parse_args()
    import pandas

    if int(pandas.__version__.split(".")[0]) >= 3:
        sys.exit("error: BABILong's code needs pandas < 3 (pandas 3 reads its None answers as NaN); "
                 "run this in an environment with pandas 2")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    code = official_code(args.babilong, args.commit, Path(tempfile.mkdtemp()))
    sys.path.insert(0, str(code))
    import babilong  # noqa: F401  (the official package, from `code`)

    prompts(out)
    scores(out)
    collect(out)
    generator(out)
    frozen = Path(args.frozen)
    pipeline(out, frozen, ["qa1", "qa2", "qa3", "qa4", "qa5"], ["0k", "1k"])
    print(f"wrote the reference under {out}")


if __name__ == "__main__":
    main()
