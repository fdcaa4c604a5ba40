"""`megaeval academic`: harness prompts, request encoding, scoring, exact match, aggregation, end to end, resume."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import statistics
from pathlib import Path

import pytest
import torch

from megaeval import MegaevalError, load_model
from megaeval.commands.academic import AcademicSettings, run_academic
from megaeval.metrics.academic import choice_predictions, exact_match, group_scores, mean_stderr
from megaeval.scoring.answering import LocalAnswerer
from megaeval.scoring.requests import encode_pair
from megaeval.tasks.academic.docs import TaskDocs, draw_exemplars, hellaswag_preprocess
from megaeval.tasks.academic.evaluate import FewshotCache, evaluate_choices, evaluate_generation
from megaeval.tasks.academic.prepare import prepare_academic_task
from megaeval.tasks.specs import list_tasks, load_spec
from megaeval_testing import REPO, smollm2
from megaeval_testing.lm_eval_tasks import MMLU_SUBJECTS, TASKS, harness_data

SAMPLES = REPO / "data_prep" / "samples"
NQ_ARTICLES = ["\\b(?:The |the |An |A |The |a |an )"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The fixture models are tiny: on a busy 2-core machine, handing each small op to a second thread costs far
    more than the op (the end-to-end test ran 100x slower), so these tests run single-threaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def prepared(task: str, **overrides):
    settings = AcademicSettings(tasks=task, data_dir=str(SAMPLES), **overrides)
    return prepare_academic_task(settings, task, {})


def doc_of(task: str, doc_id: int, **overrides):
    return next(d for d in prepared(task, **overrides).docs if d.doc_id == doc_id)


def rows(task: str, split: str) -> list[dict]:
    return [json.loads(line) for line in (SAMPLES / task / f"{split}.jsonl").read_text().splitlines()]


# Prompts: expected strings typed from the harness's task definitions (see each suites/academic/<task>.yaml).


def test_the_suite_has_the_ten_table_1_tasks():
    assert list_tasks("academic") == TASKS
    for task in TASKS:
        spec = load_spec("academic", task)
        assert spec["headline"] in spec["metrics"]
        assert spec["shots"] == (5 if task in ("mmlu", "nq_open", "triviaqa") else 0)


def test_task_files_name_code_that_exists():
    """A task file that says where megaeval implements a fact names a module (and names) that exist."""
    import importlib
    import re

    for path in sorted((REPO / "suites").rglob("*.yaml")):
        for module, names in re.findall(r"(megaeval/[\w/]+)\.py(?:\s*#?\s*\(([\w, ]+)\))?", path.read_text()):
            assert (REPO / f"{module}.py").is_file(), f"{path.name} names {module}.py"
            code = importlib.import_module(module.replace("/", "."))
            for name in filter(None, (n.strip() for n in names.split(","))):
                assert hasattr(code, name), f"{path.name} names {module}.{name}"


def test_hellaswag_prompt_and_preprocessing():
    doc = doc_of("hellaswag", 2)  # ctx_b "then" is capitalised; the endings start with ","
    assert doc.contexts == [
        "Hand washing clothes: A person puts a garment in a pail, then he adds detergent and water. Then"
    ]
    assert doc.continuations == [
        " , the man washes the cloth with his hand, and then pours water and rinse several times.",
        " , the person holds the pail and pours the detergent in the cloth.",
        " , the man dries the pail in a dryer.",
        " , the person puts fresh cleaning solution and then cleans with his hands.",
    ]
    assert doc.gold == 0 and doc.choices[2] == ", the man dries the pail in a dryer."
    # WikiHow artifacts: " [title]" becomes ". ", other tags vanish, one pass of "  " -> " "
    wikihow = " Home and Garden: [header] How to grow tomatoes [title] Water daily. [step] Keep   soil moist. "
    assert hellaswag_preprocess(wikihow) == "Home and Garden: How to grow tomatoes. Water daily. Keep  soil moist."
    td = TaskDocs(load_spec("academic", "hellaswag"))
    row = {"activity_label": "Cooking", "ctx_a": "A chef [step] cuts.", "ctx_b": "THE onion", "endings": ["a"] * 4,
           "label": "1"}  # fmt: skip
    assert td.query(td.process(row, "row")) == "Cooking: A chef cuts. The onion"  # capitalize() lower-cases the rest


def test_piqa_siqa_boolq_prompts():
    piqa = doc_of("piqa", 1)
    assert piqa.contexts == ["Question: dresser\nAnswer:"]
    assert piqa.continuations == [" replace drawer with bobby pin ", " finish, woodgrain with  bobby pin "]
    assert piqa.gold == 1
    siqa = doc_of("siqa", 0)
    expected = (
        "Q: Tracy didn't go home that evening and resisted Riley's attacks. What does Tracy need to do before this?"
    )
    assert siqa.contexts == [expected + "\nA:"]
    assert siqa.continuations == [" make a new plan", " Go home and see Riley", " Find somewhere to go"]
    assert siqa.gold == 2  # label "3"
    boolq = doc_of("boolq", 8)
    passage = "Persons driving into Canada must have their vehicle's registration document and proof of insurance."
    assert boolq.contexts == [passage + "\nQuestion: can u drive in canada with us license?\nAnswer:"]
    assert boolq.continuations == [" no", " yes"] and boolq.gold == 1


def test_winogrande_partial_scoring_requests():
    doc = doc_of("winogrande", 0)
    assert doc.contexts == ["Sarah was a much better surgeon than Maria so Sarah",
                            "Sarah was a much better surgeon than Maria so Maria"]  # fmt: skip
    assert doc.continuations == [" always got the easier cases."] and doc.gold == 1
    td = TaskDocs(load_spec("academic", "winogrande"))
    row = {"sentence": "The dog chased the cat because _'s owner  ran.", "option1": "the dog", "option2": "the cat",
           "answer": "1"}  # fmt: skip
    built = td.build(0, td.process(row, "row"), [])
    assert built.contexts == ["The dog chased the cat because the dog", "The dog chased the cat because the cat"]
    assert built.continuations == [" 's owner  ran."] and built.gold == 0


def test_arc_prompts_and_digit_labels():
    easy = doc_of("arc_easy", 0)
    question = "Which statement best explains why photosynthesis is the foundation of most food webs?"
    assert easy.contexts == [f"Question: {question}\nAnswer:"]
    assert easy.continuations[0] == " Sunlight is the source of energy for nearly all ecosystems." and easy.gold == 0
    challenge = doc_of("arc_challenge", 0)
    question = (
        "An astronomer observes that a planet rotates faster after a meteorite impact. Which is the most likely effect "
        "of this increase in rotation?"
    )
    assert challenge.contexts == [f"Question: {question}\nAnswer:"]
    assert challenge.continuations[2] == " Planetary days will become shorter." and challenge.gold == 2
    td = TaskDocs(load_spec("academic", "arc_easy"))
    row = {
        "id": "x",
        "question": "Q?",
        "choices": {"text": ["a", "b", "c"], "label": ["1", "2", "3"]},
        "answerKey": "3",
    }
    assert td.build(0, td.process(row, "row"), []).gold == 2


def test_mmlu_five_shot_prompt():
    doc = doc_of("mmlu", 0)
    assert doc.group == "abstract_algebra" and doc.gold == 1
    assert doc.continuations == [" A", " B", " C", " D"] and doc.choices == ["A", "B", "C", "D"]
    assert doc.contexts == [
        "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
        "Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.\nA. 0\nB. 1\nC. 2\nD. 3\nAnswer: B\n\n"
        "Statement 1 | If aH is an element of a factor group, then |aH| divides |a|. Statement 2 | If H and K are "
        "subgroups of G then HK is a subgroup of G.\nA. True, True\nB. False, False\nC. True, False\nD. False, True\n"
        "Answer: B\n\n"
        "Statement 1 | Every element of a group generates a cyclic subgroup of the group. Statement 2 | The symmetric "
        "group S_10 has 10 elements.\nA. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer: C\n\n"
        "Statement 1| Every function from a finite set onto itself must be one to one. Statement 2 | Every subgroup of "
        "an abelian group is abelian.\nA. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer: A\n\n"
        "Find the characteristic of the ring 2Z.\nA. 0\nB. 3\nC. 12\nD. 30\nAnswer: A\n\n"
        "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\nA. 0\nB. 4\nC. 2\nD. 6\n"
        "Answer:"
    ]
    anatomy = next(d for d in prepared("mmlu").docs if d.group == "anatomy")  # exemplars from its own subject
    description = "The following are multiple choice questions (with answers) about anatomy.\n\n"
    assert anatomy.contexts[0].startswith(description + "What is the embryological origin of the hyoid bone?\n")


def test_nq_open_and_triviaqa_five_shot_prompts():
    nq = prepared("nq_open", limit=2)
    assert nq.docs[0].contexts == [
        "Answer these questions:\n\n"
        "Q: what is the song shine bright like a diamond about?\nA: a prominent concept of love\n"
        "Q: where was the church of latter day saints founded?\nA: April 6, 1830\n"
        "Q: the last time la dodgers won the world series?\nA: 1988\n"
        "Q: who governs in america’s representative democracy (republic) system?\nA: Senators\n"
        "Q: where does the movie the sound of music take place?\nA: Salzburg, Austria\n"
        "Q: when was the last time anyone was on the moon?\nA:"
    ]
    assert nq.docs[0].references == ["14 December 1972 UTC", "December 1972"]
    # The harness's sampler: one Random(1234) per task, each document draws shots + 1 in turn and keeps 5
    rng = random.Random(1234)
    assert nq.exemplar_ids == [rng.sample(range(40), 6)[:5], rng.sample(range(40), 6)[:5]]
    tqa = prepared("triviaqa", limit=1)
    train = rows("triviaqa", "train")
    picks = random.Random(1234).sample(range(len(train)), 6)[:5]
    shots = "".join(f"Question: {train[i]['question']}?\nAnswer: {train[i]['answer']['aliases'][0]}\n\n" for i in picks)
    assert tqa.docs[0].contexts == [
        shots + "Question: Brunswick, Lancastrian and Pearl Pickler are types of which vegetable??\nAnswer:"
    ]
    assert "Onion" in tqa.docs[0].references and len(tqa.docs[0].references) == 17


def test_random_sampler_drops_the_evaluated_doc():
    spec = {"task": "t", "sampler": "random", "exclude_eval_doc": True, "shot_split": "train"}
    pool = [{"q": i} for i in range(4)]
    first_draw = random.Random(7).sample(range(4), 3)
    evaluated = pool[first_draw[0]]
    (picks,) = draw_exemplars(spec, [evaluated], pool, 2, seed=7)
    assert picks == [i for i in first_draw if i != first_draw[0]][:2]
    (plain,) = draw_exemplars({**spec, "exclude_eval_doc": False}, [evaluated], pool, 2, seed=7)
    assert plain == random.Random(7).sample(range(4), 2)
    with pytest.raises(MegaevalError, match="4 shots need 5 few-shot docs but the train split has 4"):
        draw_exemplars(spec, [evaluated], pool, 4, seed=7)


# Scoring: the harness's request encoding, checked against scoring every (context, choice) from scratch.


@pytest.fixture(scope="module")
def lm64(tmp_path_factory, sp_model):
    from megaeval.models.megalodon import save_checkpoint
    from megaeval_testing import random_model

    folder = save_checkpoint(random_model(None, 0, torch.float32), tmp_path_factory.mktemp("ckpt") / "ckpt", sp_model,
                             shards=1, dtype="fp32")  # fmt: skip
    return load_model(str(folder), dtype="float64")


def brute_force_loglikelihood(lm, context: str, continuation: str, bos: bool = True) -> float:
    """The harness's split, then the whole sequence from a fresh state and a log_softmax."""
    moved = context[len(context.rstrip()) :]
    context, continuation = context.rstrip(), moved + continuation
    context_ids = lm.tokenizer.encode(context)
    cont_ids = lm.tokenizer.encode(context + continuation)[len(context_ids) :]
    ids = [lm.tokenizer.bos_id] * bos + context_ids + cont_ids
    logits, _ = lm.forward(torch.tensor([ids[:-1]]), lm.init_state(1))
    logp = torch.log_softmax(logits[0].double(), -1)
    start = len(ids) - 1 - len(cont_ids)
    return sum(float(logp[start + k, t]) for k, t in enumerate(cont_ids))


def test_trailing_context_spaces_move_to_the_continuation(lm64):
    ctx, cont = encode_pair(lm64, "Is Anne kind? ", "yes")
    assert ctx == lm64.tokenizer.encode("Is Anne kind?")
    assert cont == lm64.tokenizer.encode("Is Anne kind? yes")[len(ctx) :]


@pytest.mark.parametrize(("task", "doc_id"), [("piqa", 1), ("hellaswag", 2), ("winogrande", 0), ("arc_easy", 3)])
@pytest.mark.parametrize("bos", [True, False])
def test_choice_scores_equal_brute_force(lm64, task, doc_id, bos):
    p = prepared(task)
    doc = next(d for d in p.docs if d.doc_id == doc_id)
    record = evaluate_choices(lm64, p, doc, bos)
    if p.spec["output"] == "multiple_input":
        pairs = [(c, doc.continuations[0]) for c in doc.contexts]
    else:
        pairs = [(doc.contexts[0], c) for c in doc.continuations]
    expected = [brute_force_loglikelihood(lm64, c, x, bos) for c, x in pairs]
    assert record["loglikelihoods"] == pytest.approx(expected, rel=0, abs=1e-9)
    assert record["prediction"] == max(range(len(expected)), key=lambda i: (expected[i], -i))
    assert record["acc"] == float(record["prediction"] == doc.gold)
    context_len = len([1] * bos + lm64.tokenizer.encode(pairs[0][0].rstrip()))
    if p.spec["output"] == "multiple_choice":  # the context is read once and reused for every choice
        conts = [encode_pair(lm64, c, x)[1] for c, x in pairs]
        # all but its last token once; then each distinct (last context token + choice[:-1]) in one batched call
        distinct = {tuple(c[:-1]) for c in conts}
        assert record["forward_tokens"] == context_len - 1 + sum(len(c) + 1 for c in distinct)
        assert record["forward_tokens_from_scratch"] == sum(context_len + len(c) - 1 for c in conts)
        assert record["forward_tokens"] < record["forward_tokens_from_scratch"]


def test_mmlu_few_shot_block_is_read_once_per_subject_without_changing_scores(lm64):
    p = prepared("mmlu")
    subject = p.docs[0].group
    docs = [d for d in p.docs if d.group == subject]
    assert len(docs) >= 2 and len({d.fewshot for d in docs}) == 1
    cache = FewshotCache()
    shared = [evaluate_choices(lm64, p, d, True, cache) for d in docs]
    alone = [evaluate_choices(lm64, p, d, True, FewshotCache()) for d in docs]  # a fresh cache: read every time
    for a, b, d in zip(shared, alone, docs, strict=True):
        assert a["loglikelihoods"] == pytest.approx(b["loglikelihoods"], rel=0, abs=1e-9)
        expected = [brute_force_loglikelihood(lm64, d.contexts[0], c) for c in d.continuations]
        assert a["loglikelihoods"] == pytest.approx(expected, rel=0, abs=1e-9)
    block = len([lm64.tokenizer.bos_id] + lm64.tokenizer.encode(docs[0].fewshot))
    assert block > 100  # 5 exemplars
    assert shared[0]["forward_tokens"] == alone[0]["forward_tokens"]  # the first question reads the block
    for a, b in zip(shared[1:], alone[1:], strict=True):  # later questions skip it
        assert a["forward_tokens"] == b["forward_tokens"] - block


def harness_truncated(lm, context: list[int], continuations: list[list[int]], limit: int) -> list[float]:
    """The harness's log-likelihoods with max_length `limit`: (context + continuation)[-(limit + 1):][:-1]."""
    out = []
    for cont in continuations:
        ids = (context + cont)[-(limit + 1) :]
        logits, _ = lm.forward(torch.tensor([ids[:-1]]), lm.init_state(1))
        logp = torch.log_softmax(logits[0], -1)
        out.append(sum(float(logp[len(ids) - 1 - len(cont) + k, t]) for k, t in enumerate(cont)))
    return out


def test_fixed_context_models_lose_context_tokens_from_the_left(lm64, monkeypatch):
    p = prepared("arc_easy")
    doc = p.docs[3]
    pairs = [encode_pair(lm64, doc.contexts[0], c) for c in doc.continuations]
    context = [lm64.tokenizer.bos_id] + pairs[0][0]
    limit = len(context) - 5
    monkeypatch.setattr(lm64, "max_context", limit)
    record = evaluate_choices(lm64, p, doc, bos=True)
    expected = harness_truncated(lm64, context, [cont for _, cont in pairs], limit)
    assert record["loglikelihoods"] == pytest.approx(expected, rel=0, abs=1e-9)
    assert record["truncated_tokens"] == max(len(c) for _, c in pairs) + 4
    # a few-shot block longer than the context is never read as a prefix (an hf cache could not hold it)
    mmlu = prepared("mmlu", limit=1)
    doc = mmlu.docs[0]
    pairs = [encode_pair(lm64, doc.contexts[0], c) for c in doc.continuations]
    limit = len([lm64.tokenizer.bos_id] + lm64.tokenizer.encode(doc.fewshot)) - 1
    monkeypatch.setattr(lm64, "max_context", limit)
    cache = FewshotCache()
    record = evaluate_choices(lm64, mmlu, doc, True, cache)
    assert cache.prefix is None and record["truncated_tokens"] > 0
    expected = harness_truncated(lm64, [lm64.tokenizer.bos_id] + pairs[0][0], [cont for _, cont in pairs], limit)
    assert record["loglikelihoods"] == pytest.approx(expected, rel=0, abs=1e-9)
    nq = prepared("nq_open", limit=1)
    monkeypatch.setattr(lm64, "max_context", 256 + 10)  # room for 10 prompt tokens and 256 new ones
    gen = evaluate_generation(LocalAnswerer(lm64), nq, nq.docs[0], bos=True)
    prompt = [lm64.tokenizer.bos_id] + lm64.tokenizer.encode(nq.docs[0].contexts[0])
    assert gen["prompt_tokens"] == 10 and gen["truncated_tokens"] == len(prompt) - 10


def test_acc_norm_divides_by_characters_of_the_choice():
    # raw: choice 1 (-4 > -6); per character: choice 0 (-6/12 = -0.5 > -4/2 = -2)
    assert choice_predictions([-6.0, -4.0], ["twelve chars", "ab"]) == (1, 0)
    assert choice_predictions([-1.0, -1.0, -3.0], ["a", "b", "c"]) == (0, 0)  # ties: the first, as numpy.argmax


# Metrics


@pytest.mark.parametrize(
    ("prediction", "references", "nq", "tqa"),
    [
        ("The Beatles", ["Beatles"], 1.0, 0.0),  # NQ drops articles, TriviaQA does not
        ("beatles", ["The Beatles"], 1.0, 0.0),
        ("a cat", ["Cat"], 1.0, 0.0),
        ("THE cat", ["cat"], 0.0, 0.0),  # articles are removed before lower-casing: "THE " stays
        ("Theatre", ["atre"], 0.0, 0.0),  # only whole words followed by a space
        ("U.S.", ["US"], 1.0, 1.0),  # punctuation removed
        ("54 Mbit/s", ["54 mbits"], 1.0, 1.0),
        ("two  words", ["two words"], 0.0, 0.0),  # whitespace is not collapsed
        ("Paris", ["Lyon", "paris", "Nice"], 1.0, 1.0),  # any alias counts
        ("", ["x"], 0.0, 0.0),
    ],
)
def test_exact_match_normalisation(prediction, references, nq, tqa):
    options = dict(ignore_case=True, ignore_punctuation=True)
    assert exact_match(prediction, references, regexes_to_ignore=NQ_ARTICLES, **options) == nq
    assert exact_match(prediction, references, **options) == tqa


def test_stderr_is_the_sample_standard_deviation_over_sqrt_n():
    values = [1.0, 0.0, 1.0, 1.0, 0.0]
    assert mean_stderr(values) == pytest.approx(statistics.stdev(values) / math.sqrt(5), rel=1e-12)
    assert mean_stderr([1.0]) is None


def test_mmlu_aggregation_weighted_and_macro():
    scores = group_scores({"algebra": [1, 1, 1, 0], "anatomy": [0, 1], "empty": []})
    assert scores["weighted"] == pytest.approx(4 / 6)  # = the mean over all six questions
    assert scores["macro"] == pytest.approx((0.75 + 0.5) / 2)
    # pooled: squared deviations 0.75 + 0.5 over N - k = 4 degrees of freedom, divided by N = 6
    assert scores["stderr"] == pytest.approx(math.sqrt(1.25 / 4 / 6))
    assert scores["n"] == 6 and scores["groups"] == 2


# End to end on the real samples


def stop_after(n: int):
    def hook(done: int) -> None:
        if done == n:
            raise KeyboardInterrupt

    return hook


def test_end_to_end_on_samples_with_resume(make_checkpoint, tmp_path):
    base = dict(model=str(make_checkpoint()), data_dir=str(SAMPLES), limit=1)
    settings = AcademicSettings(**base, out=str(tmp_path / "whole.json"), samples=str(tmp_path / "s.jsonl"))
    report = run_academic(settings, progress=False)
    results = report["results"]
    assert report["command"] == "academic" and set(results) == {*TASKS, "average", "average_of"}
    assert report["settings"]["seed"] == 1234 and report["settings"]["bos"] == "auto"
    assert report["settings"]["bos_effective"] is True  # a sentencepiece (Llama-style) MEGALODON adds BOS
    assert {t["bos"] for t in report["settings"]["per_task"].values()} == {True}
    assert report["settings"]["per_task"]["nq_open"]["fewshot_delimiter"] == "\n"
    assert set(report["data"]) == {*TASKS, "mmlu:shots", "nq_open:shots", "triviaqa:shots", "samples_sha256"}
    assert report["data"]["samples_sha256"] == hashlib.sha256((tmp_path / "s.jsonl").read_bytes()).hexdigest()

    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert len(samples) == 9 + 57  # one document per task, one per MMLU subject
    by_task: dict[str, list[dict]] = {}
    for s in samples:
        by_task.setdefault(s["task"], []).append(s)
    for task in TASKS:
        res = results[task]
        assert res["n"] == len(by_task[task])
        assert res["forward_tokens"] <= res["forward_tokens_from_scratch"]
        for s in by_task[task]:
            if task in ("nq_open", "triviaqa"):
                assert isinstance(s["prediction"], str) and s["exact_match"] in (0.0, 1.0)
                assert len(s["exemplar_ids"]) == 5
            else:
                assert {"doc_id", "target", "loglikelihoods", "prediction", "acc", "acc_norm"} <= set(s)
                assert s["prediction"] == max(range(len(s["loglikelihoods"])), key=lambda i: s["loglikelihoods"][i])
    for task in ("hellaswag", "piqa", "siqa", "arc_easy", "arc_challenge"):
        assert results[task]["metric"] == "acc_norm" and "acc_norm_stderr" in results[task]
    assert results["mmlu"]["acc"] == pytest.approx(sum(s["acc"] for s in by_task["mmlu"]) / 57)
    assert len(results["mmlu"]["subjects"]) == 57 and set(results["mmlu"]["categories"]) == {
        "humanities", "other", "social_sciences", "stem"}  # fmt: skip
    assert results["mmlu"]["forward_tokens_saved"] > 0.5  # 5-shot context read once for four letters
    headline = {"mmlu": "acc", "boolq": "acc", "winogrande": "acc", "nq_open": "exact_match", "triviaqa": "exact_match"}
    expected = [results[t][headline.get(t, "acc_norm")] for t in TASKS]
    assert results["average"] == pytest.approx(sum(expected) / 10)
    assert results["average_of"] == {t: headline.get(t, "acc_norm") for t in TASKS}

    cut = AcademicSettings(**base, out=str(tmp_path / "cut.json"))
    with pytest.raises(KeyboardInterrupt):
        run_academic(cut, progress=False, on_unit=stop_after(30))  # inside MMLU
    with pytest.raises(MegaevalError, match="pass --resume"):
        run_academic(cut, progress=False)
    with pytest.raises(MegaevalError, match=r"differs from the interrupted one \(settings.seed: 1234 then, 1 now\)"):
        run_academic(AcademicSettings(**{**base, "seed": 1}, out=cut.out, resume=True), progress=False)
    changed = r"bos_effective: True then, False now; settings.bos: 'auto' then, 'never' now"
    with pytest.raises(MegaevalError, match=changed):
        run_academic(AcademicSettings(**{**base, "bos": False}, out=cut.out, resume=True), progress=False)
    resumed = run_academic(AcademicSettings(**base, out=cut.out, resume=True), progress=False)
    assert resumed["results"] == results
    assert not Path(cut.out + ".partial.jsonl").exists() and os.path.exists(cut.out)


def test_errors_name_the_problem(tmp_path):
    def run(**kw):
        return run_academic(AcademicSettings(out=str(tmp_path / "o.json"), **kw), progress=False)

    with pytest.raises(MegaevalError, match="unknown academic task"):
        run(tasks="lambada", data_dir=str(SAMPLES))
    with pytest.raises(MegaevalError, match="no train data for piqa"):
        run(tasks="piqa", shots=1, data_dir=str(SAMPLES))
    with pytest.raises(MegaevalError, match="6 shots need 6 few-shot docs but the dev"):
        run(tasks="mmlu", shots=6, data_dir=str(SAMPLES))
    with pytest.raises(MegaevalError, match="--limit must be at least 1"):
        run(limit=0, data_dir=str(SAMPLES))
    bad = tmp_path / "data" / "boolq"
    bad.mkdir(parents=True)
    (bad / "validation.jsonl").write_text(json.dumps({"question": "q", "text": "no passage", "label": 0}) + "\n")
    with pytest.raises(MegaevalError, match="boolq: validation row 0 does not fit the task's schema"):
        run(tasks="boolq", data_dir=str(tmp_path / "data"))


# Optional: the same requests and numbers as lm-evaluation-harness itself (pip install lm-eval; nothing downloaded)


def harness_tasks(data: Path, limit: int) -> dict[str, object]:
    """lm-evaluation-harness task objects built from its own YAML files, reading `data` instead of the hub."""
    from megaeval_testing.lm_eval_tasks import HARNESS_YAMLS, local_task

    tasks = {
        task: (local_task(task, data / task), 5 if task in ("nq_open", "triviaqa") else 0) for task in HARNESS_YAMLS
    }
    tasks |= {f"mmlu_{s}": (local_task("mmlu", data / "mmlu", s), 5) for s in MMLU_SUBJECTS}
    for harness_task, n in tasks.values():
        harness_task.set_config(key="num_fewshot", value=n)
        harness_task.set_fewshot_seed(1234)  # the evaluator's default fewshot_random_seed
        harness_task.build_all_requests(limit=limit)
    return {name: harness_task for name, (harness_task, _) in tasks.items()}


def grouped_requests(harness_task) -> dict[int, list]:
    out: dict[int, list] = {}
    for inst in harness_task.instances:
        out.setdefault(inst.doc_id, []).append(inst)
    return out


@pytest.mark.integration
def test_every_request_matches_lm_eval(tmp_path, monkeypatch):
    """Contexts and continuations of every sample document, as lm-evaluation-harness builds them."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = harness_data(tmp_path)
    harness = harness_tasks(data, limit=None)
    for task in TASKS:
        p = prepare_academic_task(AcademicSettings(tasks=task, data_dir=str(data)), task, {})
        names = [f"mmlu_{s}" for s in MMLU_SUBJECTS] if task == "mmlu" else [task]
        expected = [[i.args for i in group] for name in names for group in grouped_requests(harness[name]).values()]
        mine = []
        for doc in p.docs:
            if p.spec["output"] == "generate_until":
                mine.append([doc.contexts[0]])
            elif p.spec["output"] == "multiple_input":
                mine.append([(c, doc.continuations[0]) for c in doc.contexts])
            else:
                mine.append([(doc.contexts[0], c) for c in doc.continuations])
        expected = [[a[0] if isinstance(a[1], dict) else tuple(a) for a in doc] for doc in expected]
        assert mine == expected, task


@pytest.mark.integration
def test_default_settings_give_lm_eval_decisions_on_smollm2(tmp_path, monkeypatch):
    """SmolLM2-135M (GGUF), both tools with their defaults, on the first 3 sample documents of every task (of
    two MMLU subjects): lm-evaluation-harness's HFLM decisions (its own process_results) and answers, and its
    log-likelihoods within 2e-3. SmolLM2's tokenizer adds no BOS, so neither the harness nor `--bos auto` does.
    (bench/academic_vs_harness.py compares every sample document.)"""
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder, gguf = smollm2()
    data = harness_data(tmp_path)
    limit = 3
    settings = AcademicSettings(model=f"hf:{folder}", model_args={"gguf_file": gguf}, data_dir=str(data), limit=limit,
                                out=str(tmp_path / "r.json"), samples=str(tmp_path / "s.jsonl"))  # fmt: skip
    report = run_academic(settings, progress=False)
    assert report["settings"]["bos"] == "auto" and report["settings"]["bos_effective"] is False
    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]

    hflm = HFLM(pretrained=str(folder), gguf_file=gguf, batch_size=1, dtype="float32", device="cpu")
    harness = harness_tasks(data, limit=limit)
    for name, harness_task in harness.items():
        task = "mmlu" if name.startswith("mmlu_") else name
        mine = [s for s in samples if s["task"] == task]
        if task == "mmlu":
            mine = [s for s in mine if s["subject"] == name.removeprefix("mmlu_")]
        groups = list(grouped_requests(harness_task).values())
        assert len(groups) == len(mine), name
        for sample, group in zip(mine, groups, strict=True):
            where = (name, sample["doc_id"])
            if task in ("nq_open", "triviaqa"):
                (answer,) = hflm.generate_until(group)
                assert sample["prediction"] == answer.strip(), where
                continue
            results = hflm.loglikelihood(group)
            assert sample["loglikelihoods"] == pytest.approx([ll for ll, _ in results], rel=0, abs=2e-3), where
            theirs = harness_task.process_results(group[0].doc, results)  # the harness's own decisions
            assert sample["acc"] == theirs["acc"], where
            if "acc_norm" in theirs:
                assert sample["acc_norm"] == theirs["acc_norm"], where
