"""Write suites/mtbench/ from lm-sys/FastChat at COMMIT: MT-Bench's questions, GPT-4's reference answers and the
judge prompts of `fastchat/llm_judge/data` (Apache-2.0), byte for byte, with a README naming the source, the commit,
the licence and each file's sha256. SOURCE is a FastChat checkout or its git directory (the files are read from the
commit, whatever is checked out). Usage: python -m megaeval.data_prep.mtbench.fastchat_files SOURCE [OUT_DIR]"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

COMMIT = "0e6d3e4beaab66f4d3f93db72541a4abab8af28d"
FILES = {  # path in FastChat -> name in suites/mtbench
    "fastchat/llm_judge/data/judge_prompts.jsonl": "judge_prompts.jsonl",
    "fastchat/llm_judge/data/mt_bench/question.jsonl": "question.jsonl",
    "fastchat/llm_judge/data/mt_bench/reference_answer/gpt-4.jsonl": "reference_answer/gpt-4.jsonl",
    "LICENSE": "LICENSE.FASTCHAT",
}
README = """# MT-Bench data from FastChat

These files are copied byte for byte from [lm-sys/FastChat](https://github.com/lm-sys/FastChat) at commit
`{commit}`, `fastchat/llm_judge/data/`, by `python -m megaeval.data_prep.mtbench.fastchat_files`:

| file | FastChat path | sha256 |
|---|---|---|
{rows}

FastChat is licensed under the Apache License 2.0 (Copyright the FastChat authors, LMSYS; its text is
`LICENSE.FASTCHAT`). The questions, the reference answers and the judge prompts are theirs (Zheng et al.,
"Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena", NeurIPS 2023); megaeval reads them as they are.
"""


def main(source: Path, out: Path) -> None:
    """Copy each file from the commit and write the README."""
    rows = []
    for path, name in FILES.items():
        data = subprocess.run(["git", "-C", str(source), "show", f"{COMMIT}:{path}"], check=True,
                              capture_output=True).stdout  # fmt: skip
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        rows.append(f"| `{name}` | `{path}` | `{hashlib.sha256(data).hexdigest()}` |")
    (out / "README.md").write_text(README.format(commit=COMMIT, rows="\n".join(rows)), encoding="utf-8")


if __name__ == "__main__":
    here = Path(__file__).resolve().parents[2] / "suites" / "mtbench"
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else here)
