"""`megaeval graphwalks` end to end: a model given the answers scores F1 1 under both graders, its samples scored
again as --predictions give the same report, per problem type and prompt_chars bucket; the CLI prints the tables for
an embedded model; a predictions file that does not match is refused in one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.commands.graphwalks import GraphwalksSettings, run_graphwalks
from megaeval.errors import MegaevalError
from megaeval_testing import REPO, read_jsonl
from megaeval_testing.oracle import save_oracle

DATA = REPO / "tests" / "fixtures" / "graphwalks"


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> str:
    rows = pd.read_parquet(DATA / "graphwalks_128k_and_shorter.parquet").to_dict("records")
    pairs = [(r["prompt"], f"Final Answer: [{', '.join(r['answer_nodes'])}]") for r in rows]
    return str(save_oracle(tmp_path_factory.mktemp("oracle"), answers=pairs))


def test_a_model_given_the_answers_scores_1_and_its_samples_score_the_same_as_predictions(oracle, tmp_path):
    report = run_graphwalks(GraphwalksSettings(model=oracle, data=str(DATA), max_new_tokens=400,
                                               out=str(tmp_path / "r.json"), samples=str(tmp_path / "s.jsonl")),
                            progress=False)  # fmt: skip
    res = report["results"]
    assert res["mean"] == 1.0 and res["n"] == 4 and res["answer_missing"] == 0
    assert set(res["problem_types"]) == {"bfs", "parents"} and set(res["buckets"]) == {"2K", "4K"}
    assert report["settings"]["grader"] == "lm-eval" and report["settings"]["render_effective"] == "plain"
    again = run_graphwalks(GraphwalksSettings(data=str(DATA), predictions=str(tmp_path / "s.jsonl"),
                                              out=str(tmp_path / "p.json")), progress=False)  # fmt: skip
    measured = ("peak_memory_bytes", "state_bytes", "tokens_per_second", "prompt_tokens_per_second",
                "generated_tokens_per_second", "peak_memory_method")  # fmt: skip
    assert again["results"]["buckets"] == {b: {k: v for k, v in c.items() if k not in measured}
                                           for b, c in res["buckets"].items()}  # fmt: skip
    assert again["results"]["problem_types"] == res["problem_types"] and again["results"]["mean"] == res["mean"]
    lines = [{"id": s["id"], "response": "I think: " + s["response"][len("Final Answer: "):]}
             for s in read_jsonl(tmp_path / "s.jsonl")]  # fmt: skip
    (tmp_path / "bare.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for grader in ("lm-eval", "card"):
        bare_file = str(tmp_path / "bare.jsonl")
        scoring = GraphwalksSettings(data=str(DATA), predictions=bare_file, grader=grader, out=str(tmp_path / "b.json"))
        bare = run_graphwalks(scoring, progress=False)
        assert bare["results"]["mean"] == 0.0 and bare["results"]["answer_missing"] == 4


def test_the_cli_prints_the_tables_for_an_embedded_model(tmp_path):
    result = CliRunner().invoke(app, ["graphwalks", "--model", "embedded:mamba2-tiny", "--data", str(DATA), "--limit",
                                      "1", "--max-new-tokens", "4", "--no-progress", "--out",
                                      str(tmp_path / "r.json")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Graphwalks: mean F1 by problem type and prompt length" in result.output and "parents" in result.output


def test_a_predictions_file_that_does_not_match_the_records_is_refused(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "graphwalks_128k_and_shorter.parquet#0", "response": "x"}) + "\n")
    with pytest.raises(MegaevalError, match=r"has no response for record graphwalks_128k_and_shorter\.parquet#1"):
        run_graphwalks(GraphwalksSettings(data=str(DATA), predictions=str(path), out=str(tmp_path / "r.json")),
                       progress=False)  # fmt: skip
