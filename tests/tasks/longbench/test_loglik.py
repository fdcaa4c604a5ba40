"""`megaeval longbench --version 2 --protocol loglik` against lm-evaluation-harness's own `longbench2` task on the same
items: the harness's requests (its YAML read from the installed lm-eval, the dataset swapped for a local file in the
re-hosted copy's schema) equal megaeval's, and on the embedded Transformer its HFLM gives megaeval's
log-likelihoods and decisions (both truncating long contexts from the left at max_context)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megaeval.commands.longbench import LETTERS, LongbenchSettings, loglik_text, run_longbench
from megaeval.tasks.longbench.data import read_v2
from megaeval_testing import REPO

V2 = REPO / "tests" / "fixtures" / "longbench" / "v2" / "data.json"
TINY = REPO / "megaeval" / "assets" / "transformer-tiny"


def harness_task(tmp_path: Path):
    """lm-eval's longbench2 task (one of its YAML files with the shared settings) reading the fixture's items, as
    recursal/longbench-v2 holds them (choices as a list, the answer as a letter)."""
    import lm_eval
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    rows = [{**{k: v for k, v in x.items() if not k.startswith("choice_")},
             "choices": [x[f"choice_{c}"] for c in LETTERS]} for x in read_v2(str(V2))[0]]  # fmt: skip
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_yaml(Path(lm_eval.__file__).parent / "tasks" / "longbench2" / "academic_single.yaml")
    cfg.pop("tag", None)
    cfg.update(dataset_path="json", dataset_name=None, test_split="train",
               dataset_kwargs={"data_files": {"train": str(tmp_path / "items.jsonl")}})  # fmt: skip
    task = ConfigurableTask(config=cfg)
    task.build_all_requests()
    return task


@pytest.mark.integration  # needs lm-eval: pip install -e '.[harness]'; run with -m integration
def test_loglik_protocol_equals_lm_eval_longbench2(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    task = harness_task(tmp_path)
    items = read_v2(str(V2))[0]
    groups: dict[int, list] = {}
    for inst in task.instances:
        groups.setdefault(inst.doc_id, []).append(inst)
    assert [[tuple(i.args) for i in groups[d]] for d in sorted(groups)] == [
        [(loglik_text(x), f" {c}") for c in LETTERS] for x in items
    ]
    report = run_longbench(LongbenchSettings(version=2, protocol="loglik", model="embedded:transformer-tiny",
                                             data=str(V2), out=str(tmp_path / "r.json"),
                                             samples=str(tmp_path / "s.jsonl")), progress=False)  # fmt: skip
    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    hflm = HFLM(pretrained=str(TINY), batch_size=1, dtype="float32", device="cpu")
    for doc_id, sample in zip(sorted(groups), samples, strict=True):
        group = groups[doc_id]
        results = hflm.loglikelihood(group)
        assert sample["loglikelihoods"] == pytest.approx([ll for ll, _ in results], rel=0, abs=2e-3), doc_id
        assert sample["judge"] == bool(task.process_results(group[0].doc, results)["acc"]), doc_id
    assert report["results"]["protocol"] == "loglik" and report["results"]["answered"] == len(items)
    # the limit the report records is the one applied: lm-eval's left truncation, never a middle cut
    limit = report["settings"]["max_prompt_tokens_effective"]
    assert limit == "the last max_context tokens (lm-eval's left truncation)"
