"""lm-evaluation-harness's own academic tasks reading local files (for the parity tests and the academic benchmark).

`harness_data(tmp)` lays the bundled samples out as the harness reads them (MMLU: two subjects, a file each).
`local_task(task, folder)` is the harness's YAML of a megaeval academic task (MMLU: one subject's), with its
dataset swapped for the JSONL files in `folder`, so both tools read the same documents offline. Needs lm-eval.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parents[3] / "data_prep" / "samples"
TASKS = ["arc_challenge", "arc_easy", "boolq", "hellaswag", "mmlu", "nq_open", "piqa", "siqa", "triviaqa", "winogrande"]
MMLU_SUBJECTS = ("abstract_algebra", "world_religions")  # the harness reads MMLU one subject per file

# The harness's YAML file (under lm_eval/tasks) of each academic task; MMLU: one per subject (see local_task).
HARNESS_YAMLS = {
    "hellaswag": "hellaswag/hellaswag.yaml", "piqa": "piqa/piqa.yaml", "siqa": "siqa/siqa.yaml",
    "winogrande": "winogrande/default.yaml", "arc_easy": "arc/arc_easy.yaml", "arc_challenge": "arc/arc_challenge.yaml",
    "boolq": "super_glue/boolq/default.yaml", "nq_open": "nq_open/nq_open.yaml", "triviaqa": "triviaqa/default.yaml",
}  # fmt: skip


def local_task(task: str, folder: str | Path, subject: str | None = None) -> Any:
    """lm-evaluation-harness's own task for academic `task` (its YAML; MMLU: the `subject`'s) reading local JSONL
    files instead of the hub: FOLDER/<split>.jsonl, or FOLDER/<subject>_<split>.jsonl (dev and test) for MMLU."""
    import lm_eval
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    root = Path(lm_eval.__file__).parent / "tasks"
    cfg = load_yaml(
        root / "mmlu" / "default" / f"mmlu_{subject}.yaml" if task == "mmlu" else root / HARNESS_YAMLS[task]
    )
    prefix = f"{subject}_" if task == "mmlu" else ""
    files = {p.stem.removeprefix(prefix): str(p) for p in Path(folder).glob(f"{prefix}*.jsonl")}
    if task == "mmlu":
        files = {split: path for split, path in files.items() if split in ("test", "dev")}
    for key in ("training_split", "validation_split", "test_split"):
        if cfg.get(key) not in files:
            cfg[key] = None
    cfg.update(dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": files})
    cfg.pop("tag", None)
    return ConfigurableTask(config=cfg)


def harness_data(tmp_path: Path) -> Path:
    """The bundled samples as the harness reads them, MMLU cut to two subjects (one file per subject and split)."""
    data = tmp_path / "data"
    for task in TASKS:
        (data / task).mkdir(parents=True)
        for path in (SAMPLES / task).glob("*.jsonl"):
            lines = path.read_text().splitlines()
            if task == "mmlu":
                lines = [line for line in lines if json.loads(line)["subject"] in MMLU_SUBJECTS]
                for subject in MMLU_SUBJECTS:
                    mine = [line for line in lines if json.loads(line)["subject"] == subject]
                    (data / task / f"{subject}_{path.stem}.jsonl").write_text("\n".join(mine) + "\n")
            (data / task / path.name).write_text("\n".join(lines) + "\n")
    return data
