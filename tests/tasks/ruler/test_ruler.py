"""RULER's task files, metrics and summary: the 13 task files hold RULER's constants and arguments; string_match_part
and string_match_all score as RULER's evaluate.py; averages, wAvg and the effective length reproduce RULER's
published table."""

from __future__ import annotations

import copy

import pytest

from megaeval.errors import MegaevalError
from megaeval.metrics.needle import needle_score, string_match_all, string_match_part
from megaeval.metrics.ruler import ruler_summary, task_score
from megaeval.tasks.ruler.spec import check_ruler_spec, load_ruler_task
from megaeval.tasks.specs import list_tasks

RULER_TASKS = ["cwe", "fwe", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "niah_multiquery",
               "niah_multivalue", "niah_single_1", "niah_single_2", "niah_single_3", "qa_1", "qa_2", "vt"]  # fmt: skip


def test_the_thirteen_tasks_are_rulers():
    assert list_tasks("ruler") == RULER_TASKS
    specs = {t: load_ruler_task(t) for t in RULER_TASKS}
    # typed by hand from RULER's scripts/synthetic.yaml and constants.py (tokens to generate)
    assert {t: s["tokens_to_generate"] for t, s in specs.items()} == {
        **{t: 128 for t in RULER_TASKS if t.startswith("niah")}, "vt": 30, "cwe": 120, "fwe": 50, "qa_1": 32,
        "qa_2": 32}  # fmt: skip
    assert specs["niah_multikey_3"]["args"] == {"type_haystack": "needle", "type_needle_k": "uuids",
                                                "type_needle_v": "uuids", "num_needle_k": 1, "num_needle_v": 1,
                                                "num_needle_q": 1}  # fmt: skip
    assert specs["vt"]["args"] == {"type_haystack": "noise", "num_chains": 1, "num_hops": 4}
    assert specs["qa_2"]["args"] == {"dataset": "hotpotqa"} and specs["qa_2"]["metric"] == "string_match_part"
    assert specs["fwe"]["answer_prefix"] == (" Answer: According to the coded text above, the three most frequently "
                                             "appeared words are:")  # fmt: skip


@pytest.mark.parametrize("change, match", [
    ({"kind": "needle"}, r"`kind` is 'needle'"),
    ({"metric": "f1"}, r"`metric` is 'f1'"),
    ({"tokens_to_generate": 0}, r"`tokens_to_generate` is 0"),
    ({"args": {"dataset": "squad", "extra": 1}}, r"`args.extra` is not an argument of RULER's qa"),
    ({"args": {"dataset": "nq"}}, r"`args.dataset` is 'nq'"),
    ({"args": {}}, r"`args.dataset` is missing"),
    ({"template": "Question: {query}"}, r"`template` lacks the placeholder \{context\}"),
    ({"template": "{context} {query} {answer}"}, r"`template` has the unknown placeholder \{answer\}"),
    ({"template": "{context} {query"}, r"`template` is not a valid template"),
    ({"answer_prefix": " "}, r"`answer_prefix` must be a non-empty text"),
    ({"hub": "x"}, r"`hub` is not a field of a RULER task"),
])  # fmt: skip
def test_a_broken_ruler_task_file_is_one_line_naming_the_field(change, match):
    spec = {**copy.deepcopy(load_ruler_task("qa_1")), **change}
    with pytest.raises(MegaevalError, match=match) as err:
        check_ruler_spec(spec, "qa_1.yaml")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args, match", [
    ({"num_needle_k": 0}, r"`args.num_needle_k` is 0"),
    ({"num_needle_v": "4"}, r"`args.num_needle_v` is '4'; it must be a whole number"),
    ({"type_haystack": "books"}, r"`args.type_haystack` is 'books'"),
    ({"type_needle_v": "letters"}, r"`args.type_needle_v` is 'letters'"),
])  # fmt: skip
def test_broken_niah_arguments_are_one_line(args, match):
    spec = copy.deepcopy(load_ruler_task("niah_multivalue"))
    spec["args"].update(args)
    with pytest.raises(MegaevalError, match=match):
        check_ruler_spec(spec, "niah_multivalue.yaml")


def test_string_match_part_is_any_reference_and_all_is_the_share():
    refs = ["Paris", "the city of Paris", "Lutetia"]
    prediction = "It is paris."
    assert string_match_part(prediction, refs) == 1.0  # RULER: any reference found
    assert string_match_all(prediction, refs) == pytest.approx(1 / 3)  # the share lm-eval's port would report
    assert string_match_part("London", refs) == 0.0
    assert needle_score("string_match_part", "\x00 Lutetia \n", refs) == 1.0  # cleaned as RULER cleans


def test_task_scores_round_as_rulers_evaluate():
    assert task_score([1.0, 0.0, 0.5]) == 50.0
    assert task_score([1.0, 1.0, 0.0]) == 66.67  # round(66.666..., 2)


def test_the_summary_reproduces_rulers_published_gpt4_row():
    # RULER's README (c3f5e3b): GPT-4-1106-preview 96.6 96.3 95.2 93.2 87.0 81.2 | Avg 91.6, wAvg inc 89.0, dec 94.1,
    # effective length 64K
    lengths = [4096, 8192, 16384, 32768, 65536, 131072]
    row = dict(zip(lengths, [96.6, 96.3, 95.2, 93.2, 87.0, 81.2], strict=True))
    summary = ruler_summary({"all": row})
    assert round(summary["average"], 1) == 91.6
    assert round(summary["wavg_inc"], 1) == 89.0 and round(summary["wavg_dec"], 1) == 94.1
    assert summary["effective_length"] == 65536
    assert ruler_summary({"all": {4096: 85.6, 8192: 90.0}})["effective_length"] is None  # must exceed, from the start
    two = ruler_summary({"a": {4096: 100.0, 8192: 80.0}, "b": {4096: 80.0, 8192: 100.0}}, threshold=85.0)
    assert two["average_by_length"] == {4096: 90.0, 8192: 90.0} and two["effective_length"] == 8192


def test_results_from_samples_carry_rulers_table_and_report_prints_it(tmp_path):
    import json

    from megaeval.commands.report.kinds import compare
    from megaeval.metrics.ruler import ruler_results

    samples = [{"task": t, "length": n, "score": s} for t, n, s in [
        ("qa_1", 4096, 1.0), ("qa_1", 4096, 0.0), ("qa_1", 8192, 1.0), ("qa_1", 8192, 1.0),
        ("vt", 4096, 1.0), ("vt", 4096, 1.0), ("vt", 8192, 0.5), ("vt", 8192, 0.0)]]  # fmt: skip
    results = ruler_results(samples, {"qa_1": "string_match_part", "vt": "string_match_all"}, 60.0)
    assert results["tasks"]["qa_1"]["lengths"] == [{"length": 4096, "score": 50.0, "n": 2},
                                                   {"length": 8192, "score": 100.0, "n": 2}]  # fmt: skip
    assert results["lengths"] == [{"length": 4096, "average": 75.0}, {"length": 8192, "average": 62.5}]
    assert results["effective_length"] == 8192 and results["average"] == 68.75
    report = {"schema_version": 1, "command": "ruler", "model": {"spec": "m"}, "settings": {}, "data": {},
              "results": results}  # fmt: skip
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    table = compare([path])
    assert "effective length 8K" in table and "62.50" in table and "qa_1" in table
    csv = compare([path, path], fmt="csv").splitlines()
    assert csv[0] == "model,task,4K,8K" and len(csv) == 1 + 2 * 3
    broken = json.loads(path.read_text())
    broken["results"]["tasks"]["vt"]["lengths"].append({"length": 4096, "score": 1.0})
    path.write_text(json.dumps(broken))
    with pytest.raises(MegaevalError, match=r"results.tasks.vt.lengths holds a length twice"):
        compare([path])


def test_plot_draws_each_reports_average_by_length(tmp_path):
    pytest.importorskip("matplotlib")
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from typer.testing import CliRunner

    from megaeval.cli import app
    from megaeval.commands.report.plot_retrieval import ruler_figure
    from megaeval.metrics.ruler import ruler_results

    reports = []
    for name, scores in (("a", [1.0, 0.5, 0.0]), ("b", [1.0, 1.0, 0.5])):
        samples = [{"task": "vt", "length": n, "score": s} for n, s in zip((4096, 8192, 16384), scores, strict=True)]
        results = ruler_results(samples, {"vt": "string_match_all"}, 60.0)
        reports.append({"schema_version": 1, "command": "ruler", "model": {"spec": name}, "settings": {},
                        "data": {}, "results": results})  # fmt: skip
    fig = ruler_figure(plt, reports, ["a", "b"])
    lines = [line for line in fig.axes[0].get_lines() if line.get_label() in ("a (effective 4K)", "b (effective 8K)")]
    assert [list(line.get_xdata()) for line in lines] == [[4096, 8192, 16384]] * 2
    assert [list(line.get_ydata()) for line in lines] == [[100.0, 50.0, 0.0], [100.0, 100.0, 50.0]]
    assert lines[0].get_marker() != lines[1].get_marker()  # told apart without colour
    assert [list(line.get_ydata()) for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"] == [[60.0] * 2]
    plt.close(fig)
    paths = []
    for report in reports:
        paths.append(tmp_path / f"{report['model']['spec']}.json")
        paths[-1].write_text(json.dumps(report))
    svg = tmp_path / "ruler.svg"
    result = CliRunner().invoke(app, ["plot", *map(str, paths), "--out", str(svg)])
    assert result.exit_code == 0, result.output
    assert "RULER: average of 1 tasks by length" in svg.read_text()
    sweep = tmp_path / "sweep.json"
    rows = [{"context_length": 4096, "ppl": 9.0, "nll_sum": 1.0}]
    sweep.write_text(json.dumps({"schema_version": 1, "command": "ppl-sweep", "model": {"spec": "m"}, "data": {},
                                 "results": {"lengths": rows}}))  # fmt: skip
    mixed = CliRunner().invoke(app, ["plot", str(sweep), str(paths[0]), "--out", str(svg)])
    assert mixed.exit_code == 2 and "'ppl-sweep' report, and a ruler report is among the others" in mixed.stderr
