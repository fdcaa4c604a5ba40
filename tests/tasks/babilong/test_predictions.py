"""BABILong's prediction files: `--predictions` scores the official ones as BABILong's own `collect_results` does
(its accuracies on copies of the published predictions of Phi-3-mini and Gemini 3 Flash:
tests/fixtures/babilong/reference/collect_results.json), and `--write-predictions` writes the files BABILong's own
script writes for the same answers (reference/pipeline/model/, made by run_model_on_babilong.py with a stand-in
model answering canned texts)."""

from __future__ import annotations

import json
import shutil

import pytest

from megaeval.commands.babilong import BabilongSettings, run_babilong
from megaeval.errors import MegaevalError
from megaeval.tasks.babilong.predictions import read_predictions
from megaeval.tasks.babilong.prompts import format_prompt
from megaeval.tasks.babilong.spec import load_babilong_task
from megaeval_testing import REPO
from megaeval_testing.oracle import save_oracle

FIXTURES = REPO / "tests" / "fixtures" / "babilong"
OFFICIAL = json.loads((FIXTURES / "reference" / "collect_results.json").read_text())
PHI3 = FIXTURES / "predictions" / "microsoft" / "Phi-3-mini-128k-instruct"
GEMINI = FIXTURES / "predictions" / "google" / "gemini-3-flash-preview"


def scored(tmp_path, folder, **flags) -> dict:
    report = run_babilong(BabilongSettings(predictions=str(folder), out=str(tmp_path / "r.json"), **flags))
    return {t: {n: c["accuracy"] for n, c in cells.items()} for t, cells in report["results"]["tasks"].items()}


def official(model: str, config: str, lengths: list[str]) -> dict:
    found = OFFICIAL[model][config]
    return {
        t: {n: found["accuracy"][i][found["lengths"].index(n)] for n in lengths} for i, t in enumerate(found["tasks"])
    }


def test_published_predictions_score_as_collect_results_scores_them(tmp_path):
    phi = "microsoft/Phi-3-mini-128k-instruct"
    got = scored(tmp_path, PHI3, lengths="0k,128k")
    assert got == official(phi, "instruction_yes_examples_yes_post_prompt_yes", ["0k", "128k"])
    bare = scored(tmp_path, PHI3, lengths="0k", instruction=False, examples=False, post_prompt=False)
    assert bare == official(phi, "instruction_no_examples_no_post_prompt_no", ["0k"])
    gemini = scored(tmp_path, GEMINI, tasks="qa1,qa2", lengths="64k")
    assert gemini == official(
        "google/gemini-3-flash-preview", "instruction_yes_examples_yes_post_prompt_yes_chat_template_no", ["64k"]
    )
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["model"] == {"spec": None, "predictions": str(GEMINI)}
    assert report["results"]["lengths"][0]["average"] is None  # qa3-qa5 not asked for


def test_the_published_average_is_over_qa1_to_qa5(tmp_path):
    got = scored(tmp_path, PHI3, lengths="0k,128k")
    report = json.loads((tmp_path / "r.json").read_text())
    for row in report["results"]["lengths"]:
        assert row["average"] == pytest.approx(sum(got[t][row["length"]] for t in got) / 5)


def test_empty_and_none_cells_are_empty_answers(tmp_path):
    path = tmp_path / "qa1_0k_instruction_yes_examples_yes_post_prompt_yes.csv"
    path.write_text(
        ",target,output,question\n0,hallway,,Where is John? \n1,kitchen,None,Where is Mary? \n"
        '2,garden,NA,Where is Sandra? \n3,office,"The office.\nNext",Where is Daniel? \n'
    )
    rows, _ = read_predictions(path)
    assert [r["output"] for r in rows] == ["", "", "", "The office.\nNext"]
    assert scored(tmp_path, tmp_path, tasks="qa1", lengths="0k") == {"qa1": {"0k": 25.0}}


def test_a_missing_or_ambiguous_prediction_file_is_one_line(tmp_path):
    with pytest.raises(MegaevalError, match=r"holds no qa1_4k_.*its prompt names: instruction_no"):
        scored(tmp_path, PHI3, tasks="qa1", lengths="4k")
    for name in (
        "qa1_0k_instruction_yes_examples_yes_post_prompt_yes.csv",
        "qa1_0k_instruction_yes_examples_yes_post_prompt_yes_chat_template_no.csv",
    ):
        (tmp_path / name).write_text(",target,output,question\n0,hallway,hallway,Where is John? \n")
    with pytest.raises(MegaevalError, match="holds 2 files for qa1 at 0k"):
        scored(tmp_path, tmp_path, tasks="qa1", lengths="0k")


def test_written_predictions_are_the_files_babilongs_script_writes(tmp_path):
    """A model answering what the stand-in answered writes the official script's CSV byte for byte, and its JSON
    but for the pad token (the stand-in's tokenizer's)."""
    from megaeval.data_prep.babilong_reference import canned

    answers = []
    for task in ("qa1", "qa2", "qa3", "qa4", "qa5"):
        spec = load_babilong_task(task)
        for length in ("0k", "1k"):
            records = json.loads((FIXTURES / "frozen" / task / f"{length}.json").read_text())
            answers += [(format_prompt(spec, r["input"], r["question"]), canned(i, r["target"]))
                        for i, r in enumerate(records)]  # fmt: skip
    oracle = save_oracle(tmp_path / "oracle", answers=answers)
    out = tmp_path / "preds"
    settings = BabilongSettings(model=str(oracle), data=str(FIXTURES / "frozen"), lengths="0k,1k",
                                write_predictions=str(out), out=str(tmp_path / "r.json"))  # fmt: skip
    run_babilong(settings, progress=False)
    reference = sorted((FIXTURES / "reference" / "pipeline" / "model").glob("*chat_template_no*"))
    assert len(reference) == 20 and sorted(p.name for p in out.iterdir()) == [p.name for p in reference]
    for path in reference:
        if path.suffix == ".csv":
            assert (out / path.name).read_bytes() == path.read_bytes(), path.name
        else:
            mine, theirs = json.loads((out / path.name).read_text()), json.loads(path.read_text())
            mine["generate_kwargs"].pop("pad_token_id"), theirs["generate_kwargs"].pop("pad_token_id")
            assert mine == theirs and (out / path.name).read_text().startswith('{\n    "prompt"')


def cli(tmp_path, *flags):
    """`megaeval babilong` through the real command line; its result."""
    from typer.testing import CliRunner

    from megaeval.cli import app

    return CliRunner().invoke(app, ["babilong", "--no-progress", "--out", str(tmp_path / "r.json"), *flags])


def test_files_outside_the_lengths_are_named_and_without_lengths_all_are_scored(tmp_path):
    """The folder holds 0k and 128k: asked for 0k, the 128k files are named as not scored (a note and the
    report's data.left_out); given no lengths, every length the folder holds is scored."""
    result = cli(tmp_path, "--predictions", str(PHI3), "--lengths", "0k")
    assert result.exit_code == 0, result.output
    assert "also holds files at 128k, not scored: outside --lengths (pass --lengths 0k,128k" in result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["data"]["left_out"] == {"lengths": ["128k"], "why": "outside --lengths"}
    everything = run_babilong(BabilongSettings(predictions=str(PHI3), out=str(tmp_path / "all.json")))
    assert everything["settings"]["lengths"] == ["0k", "128k"] and "left_out" not in everything["data"]
    assert everything["results"]["tasks"]["qa1"]["128k"]["n"] == 100


def test_a_prediction_file_with_only_its_header_is_refused_not_scored_zero(tmp_path):
    folder = tmp_path / "preds"
    shutil.copytree(PHI3, folder)
    name = "qa2_0k_instruction_yes_examples_yes_post_prompt_yes.csv"
    (folder / name).write_text(",target,output,question\n")
    result = cli(tmp_path, "--predictions", str(folder), "--lengths", "0k")
    assert result.exit_code == 2 and f"{folder / name} holds no predictions (only its header)" in " ".join(
        result.output.split()
    )
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(("row", "message"), [
    ('1,"apple,milk",apple,What is Daniel carrying? ', "row 2: the target 'apple,milk' is none of qa1's labels"),
    ("1,,hallway,Where is John? ", "row 2: the target is empty"),
    ("1,hallway,hallway,", "row 2: the question is empty"),
])  # fmt: skip
def test_a_prediction_row_is_checked_as_an_instance_is(tmp_path, row, message):
    """The data readers' check (tasks.babilong.data.check_target), naming the file and the row."""
    folder = tmp_path / "preds"
    folder.mkdir()
    path = folder / "qa1_0k_instruction_yes_examples_yes_post_prompt_yes.csv"
    path.write_text(f",target,output,question\n0,hallway,hallway,Where is John? \n{row}\n")
    result = cli(tmp_path, "--predictions", str(folder), "--tasks", "qa1", "--lengths", "0k")
    assert result.exit_code == 2 and f"{path} {message}" in " ".join(result.output.split()), result.output
