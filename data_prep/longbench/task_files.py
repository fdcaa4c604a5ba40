"""Write suites/longbench/<task>.yaml from a THUDM/LongBench checkout: each task's prompt
(LongBench/config/dataset2prompt.json), generation budget (dataset2maxlen.json) and metric (eval.py's
dataset2metric), with the rules pred.py and eval.py apply by task name. Usage:
python -m megaeval.data_prep.longbench.task_files LONGBENCH_DIR [OUT_DIR]"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import yaml

COMMIT = "2e00731f8d0bff23dc4325161044d0ed8af94c1e"
# megaeval's metric names for eval.py's functions
METRIC_NAMES = {"qa_f1_score": "qa_f1", "qa_f1_zh_score": "qa_f1_zh", "rouge_score": "rouge",
                "rouge_zh_score": "rouge_zh", "classification_score": "classification",
                "retrieval_score": "retrieval", "retrieval_zh_score": "retrieval_zh", "count_score": "count",
                "code_sim_score": "code_sim"}  # fmt: skip
RAW = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")  # pred.py: no chat template
FIRST_LINE = ("trec", "triviaqa", "samsum", "lsht")  # eval.py: the prediction's first line
LONGBENCH_E = ("qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec", "triviaqa",
               "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p")  # fmt: skip
ZH = ("multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh")
CODE = ("lcc", "repobench-p")


def _block(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    """Texts of several lines as YAML literal blocks (readable), others as usual."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


yaml.SafeDumper.add_representer(str, _block)


def dataset2metric(eval_py: str) -> dict[str, str]:
    """eval.py's task -> metric function name table, read from its source."""
    for node in ast.walk(ast.parse(eval_py)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "dataset2metric":
            return {k.value: v.id for k, v in zip(node.value.keys, node.value.values, strict=True)}
    raise SystemExit("eval.py has no dataset2metric")


def main(root: Path, out: Path) -> None:
    """Write one task file per LongBench v1 task."""
    base = root / "LongBench"
    prompts = json.loads((base / "config/dataset2prompt.json").read_text(encoding="utf-8"))
    budgets = json.loads((base / "config/dataset2maxlen.json").read_text(encoding="utf-8"))
    metrics = dataset2metric((base / "eval.py").read_text(encoding="utf-8"))
    for task, prompt in prompts.items():
        spec = {
            "task": task,
            "prompt": prompt,
            "max_new_tokens": budgets[task],
            "metric": METRIC_NAMES[metrics[task]],
            "language": "code" if task in CODE else "zh" if task in ZH else "en",
            "chat": task not in RAW,
            "first_line": task in FIRST_LINE,
            "stop_at_newline": task == "samsum",
            "longbench_e": task in LONGBENCH_E,
        }
        head = (f"# LongBench v1 {task}: THUDM/LongBench at {COMMIT} (MIT licence, THU-KEG & Zhipu AI):\n"
                "#   prompt: LongBench/config/dataset2prompt.json, max_new_tokens: config/dataset2maxlen.json,\n"
                "#   metric: eval.py dataset2metric; chat, stop_at_newline: pred.py's rules by task name;\n"
                "#   first_line: eval.py's; longbench_e: pred.py's LongBench-E task list.\n"
                "# Written by data_prep/longbench/task_files.py; read by megaeval/tasks/longbench/spec.py.\n"
                )  # fmt: skip
        text = yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=1 << 20)
        (out / f"{task}.yaml").write_text(head + text, encoding="utf-8")


V2_TEMPLATES = {
    "0shot": "prompts/0shot.txt",
    "0shot_cot": "prompts/0shot_cot.txt",
    "0shot_cot_ans": "prompts/0shot_cot_ans.txt",
    "0shot_no_context": "prompts/0shot_no_context.txt",
}


def write_v2(root: Path, out: Path) -> None:
    """Write _v2.yaml: LongBench v2's prompt templates (the repository root's prompts/), byte for byte."""
    spec = {name: (root / path).read_text(encoding="utf-8") for name, path in V2_TEMPLATES.items()}
    head = (f"# LongBench v2's prompts: THUDM/LongBench at {COMMIT} (MIT licence, THU-KEG & Zhipu AI), the files\n"
            "#   prompts/0shot.txt, 0shot_cot.txt, 0shot_cot_ans.txt and 0shot_no_context.txt, byte for byte.\n"
            "# Written by data_prep/longbench/task_files.py; read by megaeval/tasks/longbench/spec.py.\n")  # fmt: skip
    (out / "_v2.yaml").write_text(head + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=1 << 20),
                                  encoding="utf-8")  # fmt: skip


if __name__ == "__main__":
    here = Path(__file__).resolve().parents[2] / "suites" / "longbench"
    root, out = Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else here
    main(root, out)
    write_v2(root, out)
