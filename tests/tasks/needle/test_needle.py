"""`megaeval needle`: the published templates word for word, haystacks that fit, needles where asked, the sources'
scoring, and the whole pipeline against a model that is given the answer (a fake that reads the needles)."""

from __future__ import annotations

import json
from random import Random

import numpy as np
import pytest
from typer.testing import CliRunner

from megaeval.cli import app
from megaeval.commands.needle import NeedleSettings, parse_depths, run_needle
from megaeval.errors import MegaevalError
from megaeval.metrics.needle import first_integer_match, needle_score, postprocess, string_match_all
from megaeval.models import load_model, load_tokenizer
from megaeval.scoring.chat import ChatFormat, select_template
from megaeval.scoring.requests import prompt_encoder
from megaeval.tasks.needle.haystack import RULER_DEPTHS, split_sentences
from megaeval.tasks.needle.prompts import (
    Needles,
    build_prompts,
    draw_needles,
    haystack_words,
    needle_token_offset,
    render,
    ruler_question,
    sample_rng,
)
from megaeval.tasks.needle.spec import load_needle_task
from megaeval.tasks.specs import list_tasks
from megaeval_testing.oracle import save_oracle

runner = CliRunner()
RULER_TASKS = ["niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "niah_multiquery", "niah_multivalue",
               "niah_single_1", "niah_single_2", "niah_single_3"]  # fmt: skip
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def test_the_suite_is_passkey_and_rulers_eight_niah_tasks():
    assert list_tasks("needle") == sorted(["passkey", *RULER_TASKS])
    assert RULER_DEPTHS[:4] == (0, 3, 5, 8) and RULER_DEPTHS[-1] == 100 and len(RULER_DEPTHS) == 40  # numpy's round


# ---- the templates, typed by hand from the sources (landmark-attention run_test.py, RULER constants.py/niah.py)


def test_passkey_prompt_word_for_word():
    spec = load_needle_task("passkey")
    needles = Needles(["The pass key is 31337. Remember it. 31337 is the pass key."], [], "", ["31337"], 0)
    text, at, _ = render(spec, needles, 7, 50)  # 7 filler sentences: 3 before the needle, 4 after it
    expected = (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
        "I will quiz you about the important information there.\n"
        "The grass is green. The sky is blue. The sun is yellow.\n"
        "The pass key is 31337. Remember it. 31337 is the pass key.\n"
        "The grass is green. The sky is blue. The sun is yellow. Here we go.\n"
        "What is the pass key? The pass key is"
    )
    assert text == expected
    assert text[at:].startswith("The pass key is 31337.")


def test_passkey_draws_a_key_from_1_to_50000():
    spec = load_needle_task("passkey")
    keys = [int(draw_needles(spec, Random(i)).answers[0]) for i in range(300)]
    assert min(keys) >= 1 and max(keys) <= 50000 and len(set(keys)) > 250


def test_ruler_single_value_prompt_word_for_word():
    spec = load_needle_task("niah_single_1")
    needle = "One of the special magic numbers for calm-river is: 1234567."
    needles = Needles([needle], [], "calm-river", ["1234567"], 0)
    text, at, _ = render(spec, needles, 2, 50)
    _, prefix = ruler_question(spec, needles)
    assert text + prefix == (
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.\n"
        f"{FILLER}\nOne of the special magic numbers for calm-river is: 1234567.\n{FILLER}\n"
        "What is the special magic number for calm-river mentioned in the provided text?"
        " The special magic number for calm-river mentioned in the provided text is"
    )
    assert text[at:].startswith("One of the special magic numbers for calm-river is: 1234567.")


def test_ruler_multi_value_prompt_keeps_the_plural_template():
    spec = load_needle_task("niah_multiquery")
    needles = Needles(["One of the special magic numbers for a-b is: 1111111.",
                       "One of the special magic numbers for c-d is: 2222222."], [100], "a-b, and c-d",
                      ["1111111", "2222222"], 0)  # fmt: skip
    words = tuple("First one here. Second one there. Third one everywhere.".split())
    text, at, _ = render(spec, needles, len(words), 0, words)
    _, prefix = ruler_question(spec, needles)
    assert text + prefix == (
        "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the numbers afterwards.\n"
        # RULER's essay join: the (empty) run before the first needle, the needle, the run after it, ...
        " One of the special magic numbers for a-b is: 1111111. First one here. Second one there. "
        "Third one everywhere. One of the special magic numbers for c-d is: 2222222. \n"
        "What are all the special magic numbers for a-b, and c-d mentioned in the provided text?"
        " The special magic numbers for a-b, and c-d mentioned in the provided text are"
    )
    assert text[at:].startswith("One of the special magic numbers for a-b is: 1111111.")


SINGULAR = {"niah_single_1": "number", "niah_single_2": "number", "niah_single_3": "uuid",
            "niah_multikey_1": "number", "niah_multikey_2": "number", "niah_multikey_3": "uuid"}  # fmt: skip


@pytest.mark.parametrize("task", RULER_TASKS)
def test_every_ruler_task_has_rulers_instruction_question_and_answer_prefix(task):
    spec = load_needle_task(task)
    needles = draw_needles(spec, sample_rng(7, task, 4096, 0))
    words = haystack_words(spec, None)
    text, _, _ = render(spec, needles, 120, 50, words)
    _, prefix = ruler_question(spec, needles)
    first, last = text.split("\n")[0], text.split("\n")[-1]
    q = needles.query
    if task in SINGULAR:  # one value asked: RULER's singular rewrite
        kind = SINGULAR[task]
        assert first == (f"A special magic {kind} is hidden within the following text. Make sure to memorize it. "
                         f"I will quiz you about the {kind} afterwards.")  # fmt: skip
        assert last == f"What is the special magic {kind} for {q} mentioned in the provided text?"
        assert prefix == f" The special magic {kind} for {q} mentioned in the provided text is"
    else:
        assert first == ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
                         "I will quiz you about the numbers afterwards.")  # fmt: skip
        assert last == f"What are all the special magic numbers for {q} mentioned in the provided text?"
        assert prefix == f" The special magic numbers for {q} mentioned in the provided text are"
    plural = "uuids" if task == "niah_multikey_3" or task == "niah_single_3" else "numbers"
    for needle in needles.needles:
        assert needle.startswith(f"One of the special magic {plural} for ") and needle in text
    assert all(any(n.endswith(f" is: {a}.") for n in needles.needles) for a in needles.answers)
    haystack = {"niah_single_1": "noise", "niah_multikey_2": "needle", "niah_multikey_3": "needle"}.get(task, "essay")
    body = text.split("\n", 1)[1].rsplit("\n", 1)[0]
    if haystack == "noise":
        assert set(body.split("\n")) == {FILLER, needles.needles[0]}
    elif haystack == "needle":
        assert all(line.startswith(f"One of the special magic {plural} for ") for line in body.split("\n"))
    else:
        assert "Emma Woodhouse, handsome, clever, and rich" in body  # the books, from the first words on


@pytest.mark.parametrize("task", RULER_TASKS)
def test_ruler_draws_match_the_task_files(task):
    spec = load_needle_task(task)
    needles = draw_needles(spec, sample_rng(42, task, 4096, 0))
    k, v, q = max(spec["num_needle_k"], spec["num_needle_q"]), spec["num_needle_v"], spec["num_needle_q"]
    assert len(needles.needles) == k * v and len(needles.answers) == q * v and len(needles.other_depths) == k * v - 1
    value = {"numbers": r"\d{7}", "uuids": r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"}.get(
        spec["type_needle_v"], r"[a-z]+-[a-z]+"
    )
    import re

    for answer in needles.answers:
        assert re.fullmatch(value, answer), answer
    assert all(f"is: {a}." in " ".join(needles.needles) for a in needles.answers)
    assert needles.answers[0] in needles.needles[0]  # the needle put at the asked depth is one asked about
    assert needles.query.count(", and ") == (q > 1) and needles.query.count(",") == (q - 1 if q > 1 else 0)
    again = draw_needles(spec, sample_rng(42, task, 4096, 0))
    assert again == needles  # the same seed, the same sample


def test_needle_haystack_is_distractor_needles_one_per_line():
    spec = load_needle_task("niah_multikey_3")
    needles = draw_needles(spec, sample_rng(1, "niah_multikey_3", 4096, 0))
    text, at, _ = render(spec, needles, 20, 30)
    body = text.split("\n")[1:-1]
    assert len(body) == 21 and all(line.startswith("One of the special magic uuids for ") for line in body)
    assert body.index(needles.needles[0]) == 6  # 20 lines * 30%
    assert render(spec, needles, 10, 30)[0].split("\n")[1:4] == body[:3]  # a longer haystack extends a shorter one


def test_sentences_are_split_at_stops_but_not_after_titles():
    text = 'Mr. Darcy bowed. "Indeed!" said she. Was it so? yes, it was... Then Mrs. Bennet left.'
    assert split_sentences(text) == ["Mr. Darcy bowed.", '"Indeed!" said she.', "Was it so? yes, it was...",
                                     "Then Mrs. Bennet left."]  # fmt: skip


# ---- prompts that fit, needles where asked


@pytest.fixture(scope="module", params=["embedded:megalodon-tiny", "embedded:transformer-tiny"])
def encoder(request):
    class Lm:  # the encoder needs a tokenizer only
        tokenizer = load_tokenizer(request.param)

    return prompt_encoder(Lm(), bos=True)


@pytest.mark.parametrize("task", ["passkey", "niah_single_1", "niah_single_2", "niah_multikey_2", "niah_multivalue"])
@pytest.mark.parametrize("length", [1000, 4096])
def test_the_haystack_fills_each_length_and_no_more(encoder, task, length):
    spec = load_needle_task(task)
    needles = draw_needles(spec, sample_rng(3, task, length, 0))
    words = haystack_words(spec, None)
    depths, new = [0, 33, 50, 100], 32
    prompts = build_prompts(spec, needles, length, depths, new, encoder, words)
    budget = length - new
    assert all(len(p.ids) <= budget for p in prompts)
    units = prompts[0].haystack_units
    bigger = build_prompts(spec, needles, length + 400, depths, new, encoder, words)[0].haystack_units
    grow = max(1, (bigger - units) // 8)  # ~50 tokens of haystack
    prefix = ruler_question(spec, needles)[1] if spec["kind"] == "ruler_niah" else ""
    one_more = [len(encoder(render(spec, needles, units + grow, d, words)[0], prefix)[0]) for d in depths]
    assert max(one_more) > budget  # a little more haystack would not fit: the prompts fill the length
    for p in prompts:  # every prompt ends with the question (and answer prefix), the needle inside
        assert p.text.endswith(("The pass key is", "mentioned in the provided text is",
                                "mentioned in the provided text are"))  # fmt: skip
        assert p.text[p.needle_char :].startswith(needles.needles[0])


@pytest.mark.parametrize("model", ["embedded:megalodon-tiny", "embedded:transformer-tiny"])
@pytest.mark.parametrize("task", ["passkey", "niah_single_2", "niah_multikey_1", "niah_multikey_2"])
def test_the_needle_token_offset_is_the_first_token_holding_the_needle(model, task):
    tokenizer = load_tokenizer(model)

    class Lm:
        pass

    Lm.tokenizer = tokenizer
    spec = load_needle_task(task)
    needles = draw_needles(spec, sample_rng(7, task, 1024, 0))
    prompts = build_prompts(spec, needles, 1024, [0, 40, 100], 32, prompt_encoder(Lm(), True),
                            haystack_words(spec, None))  # fmt: skip
    for p in prompts:
        # naive: the first token whose decoded prefix of the prompt reaches into the needle's characters
        ids = p.ids.tolist()
        first = next(k for k in range(1, len(ids)) if len(tokenizer.decode(ids[1 : k + 1])) > p.needle_char)
        assert needle_token_offset(p, tokenizer.encode, bos=True) == first, (p.depth, first)


@pytest.mark.parametrize("task", ["passkey", "niah_single_1", "niah_single_2", "niah_multikey_3"])
@pytest.mark.parametrize("depth", [0, 10, 25, 50, 77, 100])
def test_the_needle_sits_within_one_sentence_of_the_asked_depth(task, depth):
    spec = load_needle_task(task)
    needles = draw_needles(spec, sample_rng(5, task, 8192, 0))
    words = haystack_words(spec, None)
    text, at, _ = render(spec, needles, 400, depth, words)
    template_head = text.index("\n") + 1  # the instruction line
    before, after = text[template_head:at], text[at + len(needles.needles[0]) :]
    others = [n for n in needles.needles[1:]]

    def count(s: str) -> int:  # haystack sentences (books, filler) or lines (noise, distractor needles)
        if spec.get("haystack") == "essay" or spec["kind"] == "passkey":
            return len(split_sentences(s))
        return len([line for line in s.split("\n") if line.strip()])

    n_before = count(before) - sum(before.count(n) for n in others)
    n_after = count(after.rsplit("\n", 1)[0]) - sum(after.count(n) for n in others)
    if spec["kind"] == "passkey":
        n_after = count(after.split("\n")[1])
    total = n_before + n_after
    assert abs(n_before - total * depth / 100) <= 1.0, (n_before, n_after)


# ---- scoring as the sources score


def test_string_match_all_is_the_share_of_values_found_case_insensitively():
    assert string_match_all("The numbers are 1234567 and 7654321.", ["1234567", "7654321"]) == 1.0
    assert string_match_all("just 1234567", ["1234567", "7654321", "1111111", "2222222"]) == 0.25
    assert string_match_all("ABC-def-ghi", ["abc-DEF-ghi"]) == 1.0
    assert string_match_all("", ["1"]) == 0.0
    assert postprocess(" \x00 7 \x1f\n") == "7"  # RULER: strip, control characters to newlines, strip
    assert needle_score("string_match_all", "  12\x0734", ["12\n34"]) == 1.0


def test_first_integer_match_takes_the_first_integer_only():
    assert first_integer_match(" 42. Remember it.", ["42"]) == 1.0
    assert first_integer_match(" 042", ["42"]) == 1.0  # compared as integers, as int(re.search(...)) does
    assert first_integer_match(" 7 and then 42", ["42"]) == 0.0
    assert first_integer_match(" no idea", ["42"]) == 0.0
    assert first_integer_match("423", ["42"]) == 0.0


def test_depths_parse_and_refuse():
    assert parse_depths("100,0,50,50") == [0, 50, 100]
    for bad in ("", "-5", "101", "a"):
        with pytest.raises(MegaevalError):
            parse_depths(bad)


# ---- the whole pipeline, against a model that is given the answer


def settings(tmp_path, model, **kw) -> NeedleSettings:
    tmp_path.mkdir(parents=True, exist_ok=True)
    base = dict(model=str(model), tasks="all", lengths="1K,2K", depths="0,50,100", samples_per_cell=2,
                max_new_tokens=120, out=str(tmp_path / "r.json"), samples=str(tmp_path / "s.jsonl"))  # fmt: skip
    return NeedleSettings(**{**base, **kw})


def test_a_model_given_the_answer_scores_one_everywhere(tmp_path):
    oracle = save_oracle(tmp_path / "oracle")
    report = run_needle(settings(tmp_path, oracle, lengths="1536,2K", samples_per_cell=1), progress=False)
    results = report["results"]
    assert results["average"] == 1.0
    for task in list_tasks("needle"):
        assert results[task]["accuracy"] == 1.0 and results[task]["n"] == 1 * 3 * 2
        assert {(c["length"], c["depth"]) for c in results[task]["cells"]} == {(n, d) for n in (1536, 2048)
                                                                               for d in (0, 50, 100)}  # fmt: skip
        assert all(c["accuracy"] == 1.0 and c["n"] == 1 for c in results[task]["cells"])
        assert results[task]["tokens_read"] < results[task]["tokens_naive"]  # the haystack read once per sample
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert len(rows) == 9 * 6
    for row in rows:
        assert row["score"] == 1.0 and row["prompt_tokens"] <= row["length"] - 120
        assert {"task", "length", "depth", "prompt_tokens", "needle_token_offset", "answer", "prediction",
                "prompt_head", "prompt_tail"} <= set(row)  # fmt: skip
        assert len(row["prompt_head"]) == 300 and len(row["prompt_tail"]) == 300
    # a byte tokenizer: the needle starts after BOS + its character offset, deeper for a deeper needle, and with one
    # needle in 2K bytes near the asked share of the prompt (the template and question take the rest)
    for row in rows:
        assert row["prompt_head" if row["depth"] == 0 else "prompt_tail"]
        if row["length"] == 2048 and row["depth"] < 100 and row["task"] in ("passkey", "niah_single_2"):
            assert abs(row["needle_token_offset"] / row["prompt_tokens"] - row["depth"] / 100) < 0.1, row
    offsets = {}
    for row in rows:
        offsets.setdefault((row["task"], row["length"], row["sample"]), []).append(row["needle_token_offset"])
    assert all(o == sorted(o) and o[0] < o[-1] for o in offsets.values())


def test_a_model_that_forgets_fails_where_the_needle_is_far(tmp_path):
    oracle = save_oracle(tmp_path / "oracle", window=700)  # sees the last 700 characters only
    report = run_needle(settings(tmp_path, oracle, tasks="passkey", lengths="2K", depths="0,50,95,100"),
                        progress=False)  # fmt: skip
    cells = {c["depth"]: c["accuracy"] for c in report["results"]["passkey"]["cells"]}
    assert cells == {0: 0.0, 50: 0.0, 95: 1.0, 100: 1.0}


def test_shared_and_naive_reading_give_the_same_answers(tmp_path):
    common = dict(tasks="passkey,niah_single_2", lengths="1K", depths="0,40,100", samples_per_cell=1,
                  max_new_tokens=6, dtype="float64")  # fmt: skip
    shared = run_needle(settings(tmp_path, "embedded:megalodon-tiny", schedule="shared", **common), progress=False)
    naive = run_needle(settings(tmp_path, "embedded:megalodon-tiny", schedule="naive", **common), progress=False)
    pick = lambda r: [(c["length"], c["depth"], c["accuracy"]) for t in ("passkey", "niah_single_2")  # noqa: E731
                      for c in r["results"][t]["cells"]]  # fmt: skip
    assert pick(shared) == pick(naive)
    a, b = shared["results"]["passkey"], naive["results"]["passkey"]
    assert a["tokens_read"] < b["tokens_read"] == b["tokens_naive"] == a["tokens_naive"]


def test_predictions_do_not_depend_on_the_schedule(tmp_path):
    lm = load_model("embedded:megalodon-tiny", dtype="float64")
    from megaeval.scoring.generate import generate_branches

    rng = np.random.default_rng(0)
    trunk = rng.integers(5, 400, 700)
    prompts = [np.concatenate([trunk[:at], rng.integers(5, 400, 300 - at // 3)]) for at in (0, 100, 650)]
    shared, read_shared = generate_branches(lm, prompts, lm.init_state(1), 8, shared=True)
    naive, read_naive = generate_branches(lm, prompts, lm.init_state(1), 8, shared=False)
    assert [g.tokens for g in shared] == [g.tokens for g in naive]
    assert read_naive == sum(len(p) for p in prompts) and read_shared == read_naive - 100  # the start P1 shares with P2


@pytest.mark.slow  # long: run with -m slow
def test_memory_of_a_state_carrying_model_is_flat_from_4k_to_64k(tmp_path):
    peaks, states = [], []
    for length in ("4K", "64K"):
        report = run_needle(NeedleSettings(lengths=length, depths="50", out=str(tmp_path / f"{length}.json")),
                            progress=False)  # fmt: skip
        row = report["results"]["passkey"]["lengths"][0]
        peaks.append(row["peak_memory_bytes"])
        states.append(row["state_bytes"])
        assert row["mean_prompt_tokens"] > 0.99 * (report["settings"]["lengths"][0] - 10)
    # the state does not grow with the tokens read (MEGALODON's holds the K/V of a partial chunk: a bounded size)
    assert max(states) <= 1.05 * min(states), states
    assert peaks[1] < 1.1 * peaks[0], peaks  # process RSS: allocator noise only


# ---- refusals, report and plot


def test_a_fixed_context_model_is_refused_past_its_context(tmp_path):
    result = runner.invoke(app, ["needle", "--model", "embedded:transformer-tiny", "--lengths", "256,1K",
                                 "--out", str(tmp_path / "r.json")])  # fmt: skip
    assert result.exit_code == 2
    line = result.output.strip()
    assert line.count("\n") == 0 and "max_context 512" in line and "--lengths" in line and "--chunk-parallel" in line
    assert not (tmp_path / "r.json").exists()


def test_chat_template_is_refused_without_one_and_wraps_the_prompt_with_one(tmp_path):
    result = runner.invoke(app, ["needle", "--model", "embedded:megalodon-tiny", "--chat-template", "--lengths", "1K",
                                 "--out", str(tmp_path / "r.json")])  # fmt: skip
    assert result.exit_code == 2 and "has no chat template" in result.output

    lm = load_model("embedded:transformer-tiny")
    turn = "<{{ m.role }}>{{ m.content }}</{{ m.role }}>"
    lm.tokenizer.tok.chat_template = "{% for m in messages %}" + turn + "{% endfor %}<bot>"
    encode = prompt_encoder(lm, False, ChatFormat("default"), select_template(lm, "default"))
    ids, whole, start = encode("Find it.", " The pass key is")
    assert whole == "<user>Find it.</user><bot> The pass key is" and whole[start:].startswith("Find it.")
    assert ids.tolist() == lm.tokenizer.encode(whole)
    instructed = ChatFormat("default", "Be exact.")
    _, whole, start = prompt_encoder(lm, False, instructed, select_template(lm, None))("Find it.", " The pass key is")
    assert whole == "<system>Be exact.</system><user>Find it.</user><bot> The pass key is" and start == 32
    _, plain, _ = prompt_encoder(lm, False, ChatFormat(None, "Be exact."))("Find it.", " The pass key is")
    assert plain == "Be exact.Find it. The pass key is"  # base mode: lm-eval joins the turns' texts as they are


def test_report_prints_a_depth_by_length_table_and_plot_draws_heatmaps(tmp_path):
    pytest.importorskip("matplotlib")
    a = run_needle(settings(tmp_path, save_oracle(tmp_path / "o1"), tasks="passkey", out=str(tmp_path / "a.json")),
                   progress=False)  # fmt: skip
    run_needle(settings(tmp_path, save_oracle(tmp_path / "o2", window=500), tasks="passkey",
                        out=str(tmp_path / "b.json")), progress=False)  # fmt: skip
    assert a is not None
    table = runner.invoke(app, ["report", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--format", "csv"])
    assert table.exit_code == 0, table.output
    lines = table.output.strip().splitlines()  # one csv table: each row names its model and task
    assert lines[0] == "model,task,depth,1K,2K" and lines[1:5] == [
        "o1,passkey,0%,1.00,1.00",
        "o1,passkey,50%,1.00,1.00",
        "o1,passkey,100%,1.00,1.00",
        "o1,passkey,mean,1.00,1.00",
    ]
    assert lines[5:9] == ["o2,passkey,0%,0.00,0.00", "o2,passkey,50%,1.00,0.00", "o2,passkey,100%,1.00,1.00",
                          "o2,passkey,mean,0.67,0.33"]  # the forgetful oracle's table  # fmt: skip
    png = tmp_path / "heat.png"
    result = runner.invoke(app, ["plot", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_the_haystack_search_finds_the_largest_fitting_size_as_a_scan_does():
    from megaeval.tasks.needle.prompts import _largest_fitting

    rng = Random(0)
    for _ in range(200):
        steps = [rng.choice([0, 1, 1, 2, 3, 9]) for _ in range(3000)]  # tokens per unit: uneven, sometimes none
        totals = np.cumsum([rng.randint(0, 50)] + steps).tolist()
        budget = rng.randint(0, totals[-1] + 5)
        calls = []

        def tokens(n, totals=totals, calls=calls):
            calls.append(n)
            return totals[min(n, len(totals) - 1)] + max(0, n - len(totals) + 1) * 3

        expected = max((n for n in range(len(totals) + 50) if tokens(n) <= budget), default=-1)
        calls.clear()
        assert _largest_fitting(tokens, budget) == expected
        assert len(calls) <= 60


# -m slow: the default run decodes needle prompts in a batch in tests/test_batched_generation.py
@pytest.mark.parametrize("model", [pytest.param("embedded:mamba2-tiny", marks=pytest.mark.slow),
                                   pytest.param("embedded:transformer-tiny", marks=pytest.mark.slow)])  # fmt: skip
def test_batch_size_one_and_auto_give_identical_reports(tmp_path, model):
    common = dict(tasks="passkey,niah_single_1", lengths="384,512", depths="0,30,60,100", samples_per_cell=2,
                  max_new_tokens=16)  # fmt: skip
    one = run_needle(settings(tmp_path / "one", model, batch_size=1, **common), progress=False)
    auto = run_needle(settings(tmp_path / "auto", model, **common), progress=False)
    assert (tmp_path / "one" / "s.jsonl").read_text() == (tmp_path / "auto" / "s.jsonl").read_text()
    strip = lambda r: {t: {k: v for k, v in res.items() if k != "peak_memory_bytes" and k != "cells" and k != "lengths"}  # noqa: E731
                       for t, res in r["results"].items() if isinstance(res, dict)}  # fmt: skip
    assert strip(one) == strip(auto)
    assert one["settings"]["batch_size_effective"] == {384: 1, 512: 1}
    assert auto["settings"]["batch_size_effective"] == {384: 8, 512: 8}  # CPU: 8 rows (a KV cache of 512 is small)
