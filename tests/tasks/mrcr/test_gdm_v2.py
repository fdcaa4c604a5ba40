"""GDM MRCR v2: its metric equals `mrcr_v2_metric` of google-deepmind/eval_hub's eval_hub/mrcr_v2/run_evaluation.py
(67b7fd2, Apache 2.0; written out below as the reference) on hand-made predictions; its CSV files are read with
their bins from their names; a model given the answers scores 1, and its samples score the same as --predictions."""

from __future__ import annotations

import difflib

import pytest

from megaeval.commands.mrcr import MrcrSettings, run_mrcr
from megaeval.errors import MegaevalError
from megaeval.metrics.mrcr import mrcr_v2_metric
from megaeval.tasks.mrcr.data import read_records, record_messages
from megaeval.tasks.mrcr.o200k import o200k
from megaeval.tasks.mrcr.prompts import plain_transcript
from megaeval_testing import REPO, read_jsonl
from megaeval_testing.oracle import save_oracle

DATA = REPO / "tests" / "fixtures" / "mrcr" / "gdm_v2"


def reference_metric(prediction: str, target: str) -> float:
    """eval_hub's mrcr_v2_metric, as published (its comments dropped)."""
    if not isinstance(prediction, str) or not prediction:
        return 0.0
    target = target.strip()
    if len(target) < 12:
        return 0.0
    random_hash = target[:12]
    target_ref = target[12:].strip()
    prediction = prediction.strip()
    start_index = prediction.rfind(random_hash)
    if start_index == -1:
        return 0.0
    prediction_content = prediction[start_index + 12 :].strip()
    d = difflib.SequenceMatcher(a=target_ref, b=prediction_content)
    return d.ratio()


HASH = "Ab3dE5gH9jK1"
TARGET = HASH + "Tapirs wander by the river,\nquiet in the morning light."
CASES = {
    "identical": TARGET,
    "with spaces around": "  \n" + TARGET + "\n",
    "hash missing": TARGET[12:],
    "hash later in the text": "Sure! " + TARGET,
    "hash twice": HASH + "first try " + TARGET,
    "partial": HASH + "Tapirs wander",
    "empty": "",
    "hash only": HASH,
    "short target": "abc",
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_metric_equals_gdms(name):
    target = "xyz" if name == "short target" else TARGET
    assert mrcr_v2_metric(CASES[name], target) == reference_metric(CASES[name], target)


def test_the_csv_files_are_read_with_their_bins_from_their_names():
    records, source = read_records(DATA, o200k())
    assert source["layout"] == "gdm v2" and {r.release for r in records} == {"gdm-v2"}
    assert [(r.bin, r.needles, r.prompt_tokens) for r in records] == [
        ("4K-8K", 2, 5000), ("4K-8K", 2, 6100), ("up to 128K", 2, 4500)]  # fmt: skip
    one, _ = read_records(next(DATA.glob("*upto_128K*")), o200k())  # one file of them: read as GDM's too
    assert [(r.bin, r.release) for r in one] == [("up to 128K", "gdm-v2")]
    messages = record_messages(records[0])
    assert len(messages) == 1 and messages[0]["role"] == "user" and records[0].random_string in messages[0]["content"]


def test_a_model_given_the_answers_scores_1_and_its_samples_score_the_same_as_predictions(tmp_path):
    records, _ = read_records(DATA, o200k())
    oracle = save_oracle(tmp_path / "oracle", answers=[(plain_transcript(record_messages(r)), r.answer)
                                                       for r in records])  # fmt: skip
    run = MrcrSettings(model=str(oracle), data=str(DATA), max_new_tokens=400, out=str(tmp_path / "r.json"),
                       samples=str(tmp_path / "s.jsonl"))  # fmt: skip
    report = run_mrcr(run, progress=False)
    assert report["results"]["mean"] == 1.0 and set(report["results"]["bins"]) == {"4K-8K", "up to 128K"}
    again = run_mrcr(MrcrSettings(data=str(DATA), predictions=str(tmp_path / "s.jsonl"), out=str(tmp_path / "p.json")),
                     progress=False)  # fmt: skip
    assert again["results"]["needles"] == report["results"]["needles"]
    assert {"context_len", "answer_token_count"} <= set(read_jsonl(tmp_path / "s.jsonl")[0])
    kept = run_mrcr(MrcrSettings(data=str(DATA), predictions=str(tmp_path / "s.jsonl"), max_length=8192,
                                 out=str(tmp_path / "k.json")), progress=False)  # fmt: skip
    assert kept["results"]["n"] == 2 and kept["data"]["left_out_bins"] == ["up to 128K"]


def test_flags_its_metric_would_ignore_are_refused(tmp_path):
    for more in ({"strip": True}, {"bin_by": "prompt"}):
        with pytest.raises(MegaevalError, match="does not apply to GDM MRCR v2"):
            run_mrcr(MrcrSettings(data=str(DATA), predictions=str(tmp_path / "p.jsonl"), out=str(tmp_path / "r.json"),
                                  **more), progress=False)  # fmt: skip
