"""Run LongBench's own scorer (THUDM/LongBench) on hand-made predictions, to get the values megaeval's LongBench
metrics (megaeval/metrics/longbench.py) must equal. A developer tool: megaeval never calls it.

    /tmp/lbref/venv/bin/python data_prep/longbench/official_scores.py /tmp/LongBench

The argument is a work tree of the repository at COMMIT (`git archive` of the mirror). The environment needs the
official metric dependencies (rouge 1.0.1, jieba 0.42.1, fuzzywuzzy 0.18.0 without python-Levenshtein, numpy) under
CPython 3.11 (the `rouge` recursion threshold depends on it). It writes tests/fixtures/longbench/official_scores.json:

- cases: for each hand-made (task, prediction, answers, length), the official metric on each answer and the item's
  score by eval.py's rule, both computed by importing `LongBench/metrics.py` and `eval.py` from the work tree, with the
  recursion limit shifted by this script's extra stack depth so that recursion fails exactly where `python eval.py`
  fails; long texts are stored as recipes ({"parts": [[token, count], ...], "sep": " "}, see `build`);
- rouge_pairs: random short texts from a 4-word vocabulary (the LCS back-trace's tie rule), `rouge_score` on each;
- raises: the cases where the official raises, with the exception's name;
- eval_v1 / eval_e: `eval.py` and `eval.py --e` run as scripts on every case written in its layout
  (pred/<model>/<task>.jsonl), and eval_single: eval.py on each long case alone (checked here against `item`);
- v2: `result.py` run as a script in a temporary folder on hand-made results/ files, as it is and with
  `compensated = True` (patched in that temporary copy only), and `pred.py`'s `extract_answer` (its source taken
  with `ast`: pred.py imports openai and tiktoken at the top) on hand-made responses;
- zh_removed: the non-space characters the official Chinese normalisation deletes (all of Unicode tried).
"""

from __future__ import annotations

import ast
import json
import logging
import math
import random
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

COMMIT = "2e00731f8d0bff23dc4325161044d0ed8af94c1e"
OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "longbench" / "official_scores.json"
EVAL_DEPTH = 2  # in `python eval.py` the metric is called from frame 2: the module, then `scorer`

TREC = ["Abbreviation", "Expression abbreviated", "Animal", "Color", "Location", "Location of a city",
        "Other location", "Number", "Number of days", "Date", "Person", "Description of a person", "Description",
        "Reason"]  # fmt: skip
LSHT = ["中国", "足球", "中国足球", "国际足球", "军事", "中国军事", "国际军事", "财经", "股票", "体育"]
CLASSES = {"trec": TREC, "lsht": LSHT}
LONG_CODE = "values = [" + ", ".join(str(i * 7 % 10) for i in range(110)) + "]"


def rep(*parts: tuple[str, int], sep: str = " ") -> dict:
    """A long text as a recipe: the tokens repeated, joined by sep."""
    return {"parts": [list(p) for p in parts], "sep": sep}


def build(text: str | dict) -> str:
    """The text a recipe stands for (the test rebuilds it the same way)."""
    if isinstance(text, str):
        return text
    return text["sep"].join(tok for tok, n in text["parts"] for tok in [tok] * n)


CASES = [
    # qa_f1
    ("narrativeqa", "The cat sat.", ["a cat sat down"]),
    ("narrativeqa", "\n\nParis\nand more", ["Paris"]),
    ("narrativeqa", "Éclair — café!", ["éclair café"]),
    ("qasper", "", ["yes"]),
    ("qasper", "...", ["no"]),
    ("multifieldqa_en", "An apple a day keeps the doctor away", ["apple day doctor away", "apple"]),
    ("hotpotqa", "Paris, France", ["Paris", "France", "Lyon"]),
    ("hotpotqa", "yes yes yes no", ["yes no no"]),
    ("2wikimqa", "The the a an", ["the"]),
    ("musique", "Yes, it is!", ["yes"]),
    ("triviaqa", "\n\nLeonardo da Vinci\nQuestion: who painted it?", ["Leonardo da Vinci", "da Vinci"]),
    ("triviaqa", "Answer:\nParis", ["Paris"]),
    ("triviaqa", "\n\n\n", ["Paris"]),
    # qa_f1_zh
    ("multifieldqa_zh", "北京是中国的首都。", ["中国的首都是北京"]),
    ("multifieldqa_zh", "", ["北京"]),
    ("multifieldqa_zh", "。。。", ["北京"]),
    ("multifieldqa_zh", "答案：２０２３年，ＡＢＣ公司《报告》", ["2023年", "ABC公司"]),
    ("multifieldqa_zh", "The answer is 上海 Shanghai", ["上海"]),
    # rouge
    (
        "gov_report",
        "The report finds that costs rose. GAO recommends action.",
        ["GAO found costs rose sharply. It recommends that agencies act."],
    ),
    ("gov_report", "a b", ["   "]),
    ("gov_report", "word. word", ["word"]),
    ("gov_report", "b a d c. d a", ["a b c d"]),
    ("qmsum", "", ["The team discussed the budget."]),
    ("qmsum", "...", ["x"]),
    ("qmsum", "Budget  was\tdiscussed. . Then  lunch", ["The budget was discussed. Then lunch. "]),
    ("multi_news", "a . . b", ["a b", "a . b"]),
    ("multi_news", "x y z", ["x y", "y z w"]),
    ("samsum", "\n\nJohn will call Mary tomorrow.\nMary agrees.", ["John is going to call Mary tomorrow."]),
    ("samsum", "\n", ["Something"]),
    # rouge_zh
    ("vcsum", "会议讨论了预算问题。", ["本次会议主要讨论预算。"]),
    ("vcsum", "...", ["结论. 讨论"]),
    ("dureader", "", ["答案"]),
    ("dureader", "北京。上海", ["北京", "上海 天津"]),
    ("dureader", "Python 3.11 比 3.10 快", ["Python 3.11 更快"]),
    # classification
    ("trec", "Location of a city", ["Location of a city"]),
    ("trec", "Other location", ["Other location"]),
    ("trec", "Location", ["Location of a city"]),
    ("trec", "Number of days or Date", ["Date"]),
    ("trec", "\n\nDescription of a person\nType: Person", ["Description of a person"]),
    ("trec", "Expression abbreviated", ["Expression abbreviated"]),
    ("trec", "", ["Animal"]),
    ("trec", "Animal Color", ["Color", "Animal"]),
    ("lsht", "中国足球", ["中国足球"]),
    ("lsht", "国际足球", ["国际足球"]),
    ("lsht", "军事", ["中国军事"]),
    ("lsht", "\n类别：中国军事\n财经", ["中国军事"]),
    ("lsht", "财经 股票", ["股票"]),
    ("lsht", "体育", ["财经", "体育"]),
    # retrieval, count
    ("passage_retrieval_en", "Paragraph 12", ["Paragraph 12"]),
    ("passage_retrieval_en", "Paragraph 3, Paragraph 12 and 12", ["Paragraph 12"]),
    ("passage_retrieval_en", "The answer is Paragraph 012", ["Paragraph 12"]),
    ("passage_retrieval_en", "none", ["Paragraph 1"]),
    ("passage_retrieval_en", "Paragraph 30", ["Paragraph 30 and Paragraph 4"]),
    ("passage_retrieval_en", "Paragraph ３", ["Paragraph 3"]),
    ("passage_retrieval_zh", "段落5", ["段落5"]),
    ("passage_retrieval_zh", "答案是段落5和段落15", ["段落15"]),
    ("passage_count", "There are 7 unique paragraphs.", ["7"]),
    ("passage_count", "7, 8 or 7", ["7"]),
    ("passage_count", "seven", ["7"]),
    ("passage_count", "17", ["7"]),
    # code_sim
    ("lcc", "    return x + 1\n", ["    return x + 1"]),
    ("lcc", "\n\n# comment\n// also\n```python\nx = foo(bar)\n", ["x = foo(baz)"]),
    ("lcc", "a = `b`\nc = d", ["c = d"]),
    ("lcc", "url = 'http://x'\nfoo()", ["url = 'http://x'"]),
    ("lcc", "", ["x"]),
    ("lcc", "x", [""]),
    ("lcc", LONG_CODE.replace("3", "4"), [LONG_CODE]),
    ("repobench-p", "# only comments\n// here", ["a = 1"]),
    ("repobench-p", "self.assertEqual(result, expected)", ["self.assertEqual(expected, result)", "pass"]),
    # long one-sentence texts on both sides of the recursion threshold (990 steps for rouge, 989 for rouge_zh)
    ("gov_report", rep(("word", 990)), [rep(("word", 990))]),
    ("gov_report", rep(("word", 991)), [rep(("word", 991))]),
    ("qmsum", rep(("alpha beta gamma", 330)), [rep(("alpha beta gamma", 330))]),
    ("qmsum", rep(("alpha beta gamma", 330), ("delta", 1)), [rep(("alpha beta gamma", 330), ("delta", 1))]),
    ("multi_news", rep(("word", 2000)), [rep(("word", 990))]),
    ("multi_news", rep(("word", 2000)), [rep(("word", 991))]),
    ("multi_news", rep(("word", 990)), [rep(("word", 2000))]),
    ("gov_report", rep(("a", 600), ("b", 390)), [rep(("a", 600))]),
    ("gov_report", rep(("a", 600), ("b", 391)), [rep(("a", 600))]),
    ("gov_report", rep(("a", 700), ("b", 300)), [rep(("a", 680))]),
    ("gov_report", rep(("a", 700), ("b", 320)), [rep(("a", 680))]),
    ("samsum", rep(("word", 991)), [rep(("word", 5)), rep(("word", 990))]),
    ("vcsum", rep(("word", 989)), [rep(("word", 989))]),
    ("vcsum", rep(("word", 990)), [rep(("word", 990))]),
    ("vcsum", rep(("我们", 989), sep=""), [rep(("我们", 989), sep="")]),
    ("dureader", rep(("我们", 990), sep=""), [rep(("我们", 990), sep="")]),
]
RAISES = [("passage_retrieval_en", "Paragraph 1", ["Section 1"]), ("passage_retrieval_zh", "段落1", ["第1段"])]
LENGTHS = [1000, 5000, 9000, 3999, 4000, 7999, 8000]
RESPONSES = ["The correct answer is (B)", "**The correct answer is (C)**", "The correct answer is D.",
             "The correct answer is (E)", "The correct answer is (A). Later: The correct answer is (B)",
             "The correct answer is B. Then The correct answer is (C)", "The *correct* answer is (A)",
             "the correct answer is (A)", "The correct answer is (a)", "The correct answer is A)",
             "The correct answer is  (A)", "", "I think (C).", "The correct answer is (A) or (B)",
             "The correct answer is\n(B)", "The correct answer is (**D**)"]  # fmt: skip


def frame_depth() -> int:
    """How many frames are on the stack, the caller's included."""
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def official_scores(ev, task: str, prediction: str, answers: list[str]) -> tuple[list[float], float]:
    """The official metric on each answer and eval.py's item score, at eval.py's recursion headroom."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + frame_depth() - EVAL_DEPTH)  # this frame calls the metric, as eval.py's scorer
    try:
        metric, classes = ev.dataset2metric[task], CLASSES.get(task)
        per_answer = []
        for answer in answers:  # a loop, not a comprehension: that would be one more frame
            per_answer.append(metric(prediction, answer, all_classes=classes))
        if task in ("trec", "triviaqa", "samsum", "lsht"):
            prediction = prediction.lstrip("\n").split("\n")[0]
        item = 0.0
        for answer in answers:
            item = max(item, metric(prediction, answer, all_classes=classes))
        return per_answer, item
    finally:
        sys.setrecursionlimit(limit)


def write_layout(folder: Path, cases: list[tuple[str, str, list[str], int]]) -> None:
    """Prediction files as the official pred.py writes them: <folder>/<task>.jsonl."""
    folder.mkdir(parents=True)
    for task, prediction, answers, length in cases:
        record = {"pred": prediction, "answers": answers, "all_classes": CLASSES.get(task), "length": length}
        with (folder / f"{task}.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def run_eval(work: Path, model: str, e: bool = False) -> dict:
    """eval.py run as a script; its result.json with NaN (an empty LongBench-E bucket) as None."""
    subprocess.run([sys.executable, "eval.py", "--model", model, *(["--e"] if e else [])], cwd=work, check=True,
                   capture_output=True)  # fmt: skip
    result = json.loads((work / ("pred_e" if e else "pred") / model / "result.json").read_text(encoding="utf-8"))
    return json.loads(json.dumps(result), parse_constant=lambda c: None) if e else result


def v2_files() -> dict[str, list[dict]]:
    """Hand-made v2 result files; every group non-empty in each (result.py divides by each group's size)."""
    rng = random.Random(7)
    alpha = [{"difficulty": rng.choice(["easy", "hard"]), "length": rng.choice(["short", "medium", "long"]),
              "judge": rng.random() < 0.4} for _ in range(40)]  # fmt: skip
    for r in alpha:
        r["pred"] = None if rng.random() < 0.2 else "A"
        r["judge"] = r["judge"] and r["pred"] is not None
    # 16 easy-short with one right: 100 * 1 / 16 = 6.25 rounds to 6.2 (half to even)
    beta = [{"difficulty": "easy", "length": "short", "pred": "B" if i == 0 else None, "judge": i == 0}
            for i in range(16)] + [{"difficulty": "hard", "length": length, "pred": "C", "judge": length != "long"}
                                   for length in ("medium", "long", "medium")]  # fmt: skip
    gamma = [{"difficulty": d, "length": length, "pred": p, "judge": j} for d, length, p, j in [
        ("Easy", "short", "A", True), ("easy", "medium ", None, False), ("easy", "Long", "B", True),
        ("hard", "medium", None, False), ("", "long", "D", False), ("easy", "short", None, False),
        ("hard", "short", "A", True), ("easy", "medium", "C", True)]]  # fmt: skip
    return {"alpha.jsonl": alpha, "beta.json": beta, "gamma.jsonl": gamma}


def run_result_py(tree: Path, files: dict[str, list[dict]], compensated: bool) -> dict[str, dict[str, float]]:
    """v2 result.py run as a script in a temporary folder; its result.txt read back by model name."""
    source = (tree / "result.py").read_text(encoding="utf-8")
    if compensated:
        assert source.count("compensated = False") == 1
        source = source.replace("compensated = False", "compensated = True")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "results").mkdir()
        for name, records in files.items():
            lines = [json.dumps(records)] if name.endswith(".json") else [json.dumps(r) for r in records]
            (Path(tmp) / "results" / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        (Path(tmp) / "result.py").write_text(source, encoding="utf-8")
        subprocess.run([sys.executable, "result.py"], cwd=tmp, check=True, capture_output=True)
        header, *rows = (Path(tmp) / "result.txt").read_text(encoding="utf-8").split("\n")
    keys = ["overall", "easy", "hard", "short", "medium", "long"]
    assert header.split("\t") == ["Model", "Overall", "Easy", "Hard", "Short", "Medium", "Long"]
    return {row.split("\t")[0]: dict(zip(keys, map(float, row.split("\t")[1:]), strict=True)) for row in rows}


def official_extract(tree: Path):
    """pred.py's extract_answer, compiled alone from its source (with the `re` it uses)."""
    module = ast.parse((tree / "pred.py").read_text(encoding="utf-8"))
    (fn,) = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "extract_answer"]
    namespace: dict = {}
    tree_ = ast.fix_missing_locations(ast.Module([ast.Import([ast.alias("re")]), fn], []))
    exec(compile(tree_, "pred.py", "exec"), namespace)
    return namespace["extract_answer"]


def zh_removed(normalize) -> str:
    """Every non-space character that the official Chinese normalisation deletes."""
    chars = (chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    return "".join(c for c in chars if not c.isspace() and normalize(f"a{c}b") == "ab")


def random_pairs(rouge_score) -> list[list]:
    """Random texts over a 4-word vocabulary (LCS ties everywhere), some one long sentence, with rouge_score."""
    rng = random.Random(2024)
    out = []
    for k in range(70):
        size = (6, 14) if k < 60 else (60, 110)
        texts = []
        for _ in range(2):
            words = [rng.choice("abcd") for _ in range(rng.randint(*size))]
            if k < 60:
                words = [w + ("." if rng.random() < 0.25 else "") for w in words]
            texts.append(" ".join(words))
        out.append([*texts, rouge_score(*texts)])
    return out


def main() -> None:
    tree = Path(sys.argv[1]).resolve()
    assert sys.version_info[:2] == (3, 11) and sys.getrecursionlimit() == 1000
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "LongBench"
        work.mkdir()
        for name in ("eval.py", "metrics.py"):
            shutil.copy(tree / "LongBench" / name, work / name)
        sys.path.insert(0, str(work))
        warnings.filterwarnings("ignore", message="Using slow pure-python SequenceMatcher")
        import eval as ev  # the official eval.py (its main is guarded); it imports metrics.py
        import jieba
        import metrics

        jieba.setLogLevel(logging.WARNING)
        cases, rows = [], []
        for k, (task, prediction, answers) in enumerate(CASES):
            pred, refs = build(prediction), [build(a) for a in answers]
            per_answer, item = official_scores(ev, task, pred, refs)
            length = LENGTHS[k % len(LENGTHS)]
            cases.append({"task": task, "prediction": prediction, "answers": answers, "length": length,
                          "per_answer": per_answer, "item": item})  # fmt: skip
            rows.append((task, pred, refs, length))
        raises = []
        for task, prediction, answers in RAISES:
            try:
                official_scores(ev, task, prediction, answers)
            except Exception as exc:  # noqa: BLE001 - recording which exception the official raises
                raises.append({"task": task, "prediction": prediction, "answers": answers, "error": type(exc).__name__})
            else:
                raise AssertionError(f"the official did not raise on {task} {answers}")
        write_layout(work / "pred" / "cases", rows)
        write_layout(work / "pred_e" / "cases", rows)
        eval_v1, eval_e = run_eval(work, "cases"), run_eval(work, "cases", e=True)
        eval_single = []
        for k, (case, row) in enumerate(zip(cases, rows, strict=True)):
            if isinstance(case["prediction"], dict):
                write_layout(work / "pred" / f"single{k}", [row])
                score = run_eval(work, f"single{k}")[case["task"]]
                assert score == round(100 * case["item"], 2), (k, score, case["item"])  # the depth shift is right
                eval_single.append({"case": k, "score": score})
        files = v2_files()
        extract = official_extract(tree)
        fixture = {
            "source": "github.com/THUDM/LongBench",
            "commit": COMMIT,
            "licence": "MIT licence, THU-KEG & Zhipu AI",
            "python": sys.version.split()[0],
            "generated_by": "data_prep/longbench/official_scores.py run on a git archive of the commit with rouge "
            "1.0.1, jieba 0.42.1, fuzzywuzzy 0.18.0 (no python-Levenshtein), numpy " + __import__("numpy").__version__,
            "all_classes": CLASSES,
            "cases": cases,
            "raises": raises,
            "rouge_pairs": random_pairs(metrics.rouge_score),
            "eval_v1": eval_v1,
            "eval_e": eval_e,
            "eval_single": eval_single,
            "v2": {
                "files": files,
                "plain": run_result_py(tree, files, False),
                "compensated": run_result_py(tree, files, True),
            },  # fmt: skip
            "extract": [[r, extract(r)] for r in RESPONSES],
            "zh_removed": zh_removed(metrics.normalize_zh_answer),
        }
    assert all(math.isfinite(c["item"]) for c in cases)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
