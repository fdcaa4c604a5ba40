"""`megaeval mtbench` end to end with the embedded tiny Transformer given a chat template, answering and judging in
this process (its ratings mean nothing: the pipeline, FastChat's files, the decoding rules and resume are the point;
a real model and a served judge are tests/serving/test_mtbench.py's)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from megaeval import MegaevalError
from megaeval.cli import app
from megaeval.commands.mtbench import MtbenchSettings, run_mtbench
from megaeval.commands.report.sections import mtbench_section
from megaeval.scoring.answering import LocalAnswerer
from megaeval.tasks.mtbench.data import builtin_data, load_answers, load_judgments, load_questions
from megaeval.tasks.mtbench.results import mtbench_results
from megaeval_testing import tiny_chat_model

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip
ANSWER_KEYS = ["question_id", "answer_id", "model_id", "choices", "tstamp"]
JUDGMENT_KEYS = ["question_id", "model", "judge", "user_prompt", "judgment", "score", "turn", "tstamp"]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> str:
    """embedded:transformer-tiny with a chat template (read past its 512 tokens with max_context=4096)."""
    return tiny_chat_model(tmp_path_factory.mktemp("models") / "tiny-chat", TEMPLATE)


def settings_for(chat_model: str, tmp_path, **more) -> MtbenchSettings:
    common = dict(model=chat_model, model_args={"max_context": 4096}, judge=chat_model,
                  judge_args={"max_context": 4096}, first_n=2, max_new_tokens=6, judge_max_tokens=4,
                  output_dir=str(tmp_path / "files"), out=str(tmp_path / "r.json"))  # fmt: skip
    return MtbenchSettings(**{**common, **more})


@pytest.fixture(scope="module")
def judged(chat_model, tmp_path_factory):
    """One run answering and judging MT-Bench's first two questions (writing: sampled at 0.7) and the report."""
    tmp = tmp_path_factory.mktemp("run")
    report = run_mtbench(settings_for(chat_model, tmp, samples=str(tmp / "s.jsonl")), progress=False)
    return tmp, report


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_answers_and_judgments_are_fastchats_files_and_the_report_their_means(judged):
    tmp, report = judged
    answers = lines(tmp / "files" / "model_answer" / "tiny-chat.jsonl")
    assert [list(a) for a in answers] == [ANSWER_KEYS] * 2 and [a["question_id"] for a in answers] == [81, 82]
    assert all(a["model_id"] == "tiny-chat" and len(a["choices"][0]["turns"]) == 2 for a in answers)
    assert all(t == t.strip() for a in answers for t in a["choices"][0]["turns"])
    judgments = lines(tmp / "files" / "model_judgment" / "tiny-chat_single.jsonl")
    assert [list(j) for j in judgments] == [JUDGMENT_KEYS] * 4
    assert [(j["question_id"], j["turn"], j["judge"]) for j in judgments] == [
        (81, 1, ["tiny-chat", "single-v1"]), (82, 1, ["tiny-chat", "single-v1"]),
        (81, 2, ["tiny-chat", "single-v1-multi-turn"]), (82, 2, ["tiny-chat", "single-v1-multi-turn"])]  # fmt: skip
    first = answers[0]["choices"][0]["turns"][0]
    assert f"[The Start of Assistant's Answer]\n{first}\n[The End of Assistant's Answer]" in judgments[0]["user_prompt"]
    questions = load_questions(builtin_data() / "question.jsonl")
    expected = mtbench_results(load_judgments(tmp / "files" / "model_judgment" / "tiny-chat_single.jsonl"), questions)
    assert report["results"] == {**expected, "judged": True}
    assert report["settings"]["temperatures_effective"] == {"writing": 0.7}
    assert report["data"]["judge"]["settings"] == {"temperature": 0.0, "max_tokens": 4}
    assert report["data"]["files"]["answers"]["path"].endswith("model_answer/tiny-chat.jsonl")
    samples = lines(tmp / "s.jsonl")
    assert [(s["id"], s["model"], s["scores"]) for s in samples] == [
        (81, "tiny-chat", [judgments[0]["score"], judgments[2]["score"]]),
        (82, "tiny-chat", [judgments[1]["score"], judgments[3]["score"]])]  # fmt: skip


def test_the_written_files_judge_and_score_again_to_the_same_numbers(judged, chat_model, tmp_path):
    """--answers on the answer file (the same greedy judge: the same judgments), --judgments on the judgment file."""
    tmp, report = judged
    again = run_mtbench(MtbenchSettings(answers=[str(tmp / "files" / "model_answer" / "tiny-chat.jsonl")],
                                        judge=chat_model, judge_args={"max_context": 4096}, first_n=2,
                                        judge_max_tokens=4, output_dir=str(tmp_path / "files"),
                                        out=str(tmp_path / "a.json")), progress=False)  # fmt: skip
    assert again["results"] == report["results"] and again["model"]["spec"] is None
    ours = lines(tmp_path / "files" / "model_judgment" / "tiny-chat_single.jsonl")
    theirs = lines(tmp / "files" / "model_judgment" / "tiny-chat_single.jsonl")
    assert [{**j, "tstamp": 0} for j in ours] == [{**j, "tstamp": 0} for j in theirs]
    scored = run_mtbench(MtbenchSettings(judgments=[str(tmp / "files" / "model_judgment" / "tiny-chat_single.jsonl")],
                                         out=str(tmp_path / "j.json")), progress=False)  # fmt: skip
    assert scored["results"] == {**report["results"], "repeated_judgments": 0}


def test_each_category_answers_at_fastchats_temperature_with_its_own_seed(chat_model, tmp_path, monkeypatch):
    """Writing samples at 0.7 (seeded per question and turn: reruns agree, another --seed differs), extraction is
    greedy; a second turn reads the model's own first answer."""
    asked = []
    answer = LocalAnswerer.answer

    def record(self, prompts, rule, **kw):
        asked.append([(p.name, p.text, rule.decoding.temperature, rule.decoding.seeds) for p in prompts])
        return answer(self, prompts, rule, **kw)

    monkeypatch.setattr(LocalAnswerer, "answer", record)
    data = tmp_path / "data"
    data.mkdir()
    questions = [json.loads(x) for x in (builtin_data() / "question.jsonl").read_text().splitlines()]
    picked = [q for q in questions if q["category"] in ("writing", "extraction")][9:11]  # one of each
    (data / "question.jsonl").write_text("".join(json.dumps(q) + "\n" for q in picked))
    runs = {}
    for name, seed in (("one", 0), ("two", 0), ("seed7", 7)):
        run_mtbench(MtbenchSettings(model=chat_model, model_args={"max_context": 4096}, data=str(data), seed=seed,
                                    max_new_tokens=8, output_dir=str(tmp_path / name),
                                    out=str(tmp_path / f"{name}.json")), progress=False)  # fmt: skip
        runs[name] = load_answers(tmp_path / name / "model_answer" / "tiny-chat.jsonl").turns
    assert runs["one"] == runs["two"] and runs["seed7"] != runs["one"]
    first_run = [a for call in asked[:4] for a in call]  # turn 1 (a call per temperature), then turn 2
    by_name = {name: (temperature, seeds) for name, _, temperature, seeds in first_run}
    assert by_name["MT-Bench question 90, turn 1"] == (0.7, by_name["MT-Bench question 90, turn 1"][1])
    assert by_name["MT-Bench question 131, turn 1"] == (0.0, None)
    seeds = {name: s for name, (t, s) in by_name.items() if t}
    assert all(len(s) == 1 for s in seeds.values()) and len({s for s in seeds.values()}) == len(seeds)
    turn2 = next(text for name, text, _, _ in first_run if name == "MT-Bench question 90, turn 2")
    first_answer = runs["one"]["90"][0]
    assert f"<|assistant|>{first_answer}</s><|user|>{picked[0]['turns'][1]}</s><|assistant|>" in turn2


def test_a_run_killed_while_judging_resumes_without_asking_the_judge_again(chat_model, tmp_path, monkeypatch):
    whole = run_mtbench(settings_for(chat_model, tmp_path / "whole"), progress=False)
    judged = []
    answer = LocalAnswerer.answer

    def record(self, prompts, rule, **kw):
        judged.extend(p.name for p in prompts if p.name.startswith("judging"))
        return answer(self, prompts, rule, **kw)

    monkeypatch.setattr(LocalAnswerer, "answer", record)
    settings = settings_for(chat_model, tmp_path, batch_size=1)

    def stop(done):
        if done == 4:  # two questions answered, two judgments made
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_mtbench(settings, progress=False, on_unit=stop)
    assert len(judged) == 2
    settings.resume = True
    resumed = run_mtbench(settings, progress=False)
    assert len(judged) == 4 and resumed["results"] == whole["results"]
    assert not (tmp_path / "r.json.partial.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], r"pass exactly one of --model, --answers and --judgments \(got none\)"),
        (["--judgments", "j.jsonl", "--answers", "a.jsonl"], r"exactly one of .* \(got --answers, --judgments\)"),
        (["--judgments", "j.jsonl", "--judge", "hf:x"], r"--judge does not apply with --judgments"),
        (["--answers", "a.jsonl"], r"--answers are judged, and no --judge is given"),
        (
            ["--answers", "a.jsonl", "--judge", "hf:x", "--max-new-tokens", "9"],
            r"--max-new-tokens does not apply with --answers .*; use --max-new-tokens with --model",
        ),
        (["--model", "embedded:transformer-tiny", "--judge-max-tokens", "9"], r"--judge-max-tokens without --judge"),
        (["--model", "embedded:transformer-tiny", "--model-id", "a/b"], r"--model-id 'a/b' is not a file name"),
        (
            ["--model", "embedded:transformer-tiny", "--judge", "hf:x", "--judge-temperature", "nan"],
            r"bad --judge-temperature nan",
        ),
        (
            ["--model", "embedded:transformer-tiny"],
            r"MT-Bench asks .* its questions through its chat template, and "
            r"its tokenizer has none",
        ),
        (["--judgments", "missing.jsonl"], r"judgment file missing\.jsonl: no such file"),
        (["--model", "embedded:transformer-tiny", "--data", "."], r"--data \. holds no question\.jsonl"),
    ],
    ids=[
        "no-mode",
        "two-modes",
        "judge-when-scoring",
        "answers-no-judge",
        "generation-flag-when-judging",
        "judge-flag-no-judge",
        "model-id-path",
        "judge-temperature-nan",
        "no-chat-template",
        "missing-judgments",
        "data-without-questions",
    ],  # fmt: skip
)
def test_a_bad_command_line_is_one_line(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["mtbench", *args, "--no-progress"])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and re.search(message, result.output), result.output


def test_a_prompt_past_the_models_context_is_refused_before_answering(chat_model, tmp_path):
    settings = settings_for(chat_model, tmp_path, model_args={}, judge=None, judge_args={}, judge_max_tokens=2048,
                            max_new_tokens=1024)  # fmt: skip
    with pytest.raises(MegaevalError, match=r"question 81, turn 1: its prompt of [\d,]+ tokens and --max-new-tokens "
                       r"1,024 pass .*max_context 512; lower --max-new-tokens"):  # fmt: skip
        run_mtbench(settings, progress=False)
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "files").exists()


def test_answers_of_other_questions_are_refused_before_the_judge_loads(chat_model, tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps({"question_id": 5, "model_id": "x", "choices": [{"index": 0, "turns": ["a", "b"]}]})
                    + "\n")  # fmt: skip
    with pytest.raises(MegaevalError, match=r"answer file .*other\.jsonl has no answer to question 81"):
        run_mtbench(MtbenchSettings(answers=[str(path)], judge="hf:/nonexistent", out=str(tmp_path / "r.json")))


def test_the_page_draws_the_radar_chart_of_every_model(judged):
    _, report = judged
    results = {"judged": True, "categories_known": True, "models": {
        "a": {"turn_1": 8.0, "turn_2": 7.0, "overall": 7.5, "rated": {"turn_1": 3, "turn_2": 3}, "unrated": 0,
              "categories": {"writing": 9.0, "math": 3.5, "coding": 6.0}},
        "b": {"turn_1": 5.0, "turn_2": None, "overall": 5.0, "rated": {"turn_1": 3, "turn_2": 0}, "unrated": 3,
              "categories": {"writing": 5.0, "math": None, "coding": 4.0}}}}  # fmt: skip
    html = mtbench_section([{**report, "results": results}], ["run"])
    assert html.count('<g class="series"') == 2 and 'data-label="a"' in html and ">math</text>" in html
    assert "<td>7.50</td>" in html and "<td>3.50</td>" in html
    text = CliRunner().invoke(app, ["report", report_path(judged)])
    assert text.exit_code == 0 and "second turn" in text.output
    page = judged[0] / "p.html"
    made = CliRunner().invoke(app, ["report", report_path(judged), "--samples", str(judged[0] / "s.jsonl"),
                                    "--format", "html", "--out", str(page)])  # fmt: skip
    assert made.exit_code == 0, made.output
    answer = lines(judged[0] / "files" / "model_answer" / "tiny-chat.jsonl")[0]["choices"][0]["turns"][0]
    assert json.dumps(answer)[1:-1][:30] in page.read_text() and "Compose an engaging travel blog" in page.read_text()


def report_path(judged) -> str:
    return str(judged[0] / "r.json")


def test_a_turn_ends_at_every_eos_id_of_the_generation_config_as_generate_does():
    from types import SimpleNamespace

    from megaeval.scoring.chat import turn_end_ids

    def lm(ids):
        return SimpleNamespace(model=SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=ids)),
                               tokenizer=SimpleNamespace(eos_id=2))  # fmt: skip

    assert turn_end_ids(lm([2, 7, 9])) == (7, 9) and turn_end_ids(lm(2)) == () and turn_end_ids(lm(None)) == ()
    assert turn_end_ids(SimpleNamespace(tokenizer=SimpleNamespace(eos_id=2))) == ()  # a served model: the server's


def test_a_judge_that_never_rates_stops_the_run_in_one_line_and_resume_can_judge_on(chat_model, tmp_path):
    """The tiny judge never writes [[rating]]: after its first 10 replies the run stops (they are kept); --resume
    with --allow-unrated judges on, leaving the unrated turns out of the means as FastChat does."""
    settings = settings_for(chat_model, tmp_path, first_n=5, max_new_tokens=2, judge_max_tokens=2)
    with pytest.raises(MegaevalError, match=r"the judge \(hf:.*\) gave no rating in its first 10 replies .*; use a "
                       r"stronger judge .* or pass --allow-unrated"):  # fmt: skip
        run_mtbench(settings, progress=False)
    assert not (tmp_path / "r.json").exists()
    settings.resume, settings.allow_unrated = True, True
    report = run_mtbench(settings, progress=False)
    assert report["results"]["models"]["tiny-chat"]["unrated"] == 10 and report["results"]["models"]["tiny-chat"][
        "overall"] is None  # fmt: skip


@pytest.mark.slow  # two ranks, whole commands: Run.map's dealing is checked by default through ruler and ppl-sweep
def test_two_ranks_under_torchrun_answer_and_judge_as_one_process(chat_model, tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = ["-m", "megaeval", "mtbench", "--model", chat_model, "--model-args", "max_context=4096", "--judge",
            chat_model, "--judge-args", "max_context=4096", "--first-n", "3", "--max-new-tokens", "6",
            "--judge-max-tokens", "4", "--batch-size", "2", "--no-progress"]  # fmt: skip
    runs = {"one": [sys.executable], "two": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                             "--nproc-per-node", "2"]}  # fmt: skip
    for name, prefix in runs.items():
        outputs = ["--output-dir", str(tmp_path / name), "--out", str(tmp_path / f"{name}.json")]
        run = subprocess.run([*prefix, *args, *outputs], capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in runs)
    assert two["results"] == one["results"] and two["environment"]["world_size"] == 2
    for sub in ("model_answer/tiny-chat.jsonl", "model_judgment/tiny-chat_single.jsonl"):
        strip = [{k: v for k, v in line.items() if k != "tstamp"} for line in lines(tmp_path / "one" / sub)]
        assert [{k: v for k, v in line.items() if k != "tstamp"} for line in lines(tmp_path / "two" / sub)] == strip


@pytest.mark.parametrize("reference", [None, ["only the first turn"]], ids=["no-reference-file", "one-turn-reference"])
def test_a_reference_the_judge_needs_and_lacks_is_refused_before_the_model_answers(chat_model, tmp_path, reference):
    data = tmp_path / "data"
    (data / "reference_answer").mkdir(parents=True)
    (data / "question.jsonl").write_text(json.dumps({"question_id": 7, "category": "math", "turns": ["1+1?", "2+2?"]}))
    if reference is not None:
        (data / "reference_answer" / "gpt-4.jsonl").write_text(json.dumps(
            {"question_id": 7, "model_id": "gpt-4", "choices": [{"index": 0, "turns": reference}]}))  # fmt: skip
    with pytest.raises(MegaevalError, match=r"question 7 \(math\)"):
        run_mtbench(settings_for(chat_model, tmp_path, data=str(data)), progress=False)
    assert not (tmp_path / "files").exists() and not (tmp_path / "r.json.partial.jsonl").exists()
