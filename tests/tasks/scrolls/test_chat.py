"""`megaeval scrolls` with a chat template (issue 32): the SCROLLS prompt as the user turn, exemplars as turns,
documents cut with the template's tokens counted as fixed parts, and the refusals."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from megaeval import MegaevalError, load_model
from megaeval.commands.scrolls import ScrollsSettings, run_scrolls
from megaeval.scoring.chat import ChatFormat, chat_bos, select_template
from megaeval.tasks.scrolls.docs import Example, PromptForm, fit_few_shot, fit_prompt, shares_prefix
from megaeval.tasks.scrolls.evaluate import opening
from megaeval_testing import AUSTEN, tiny_chat_model
from megaeval_testing.scrolls_runs import run_recording

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip
SCROLLS = "{CONTEXT} Q: {QUESTION} A:"
SHOT = Example("t1", "Where do they go?", "They leave Kellynch for Bath.", ["Bath"])
FIRST = Example("v1", "Who is Anne?", "Anne Elliot is the second daughter.", ["Anne Elliot"])


@pytest.fixture
def chat_model(tmp_path):
    """embedded:transformer-tiny (max_context 512, no BOS by default) with TEMPLATE in its tokenizer_config.json."""
    return tiny_chat_model(tmp_path / "chat-model", TEMPLATE)


def write_data(folder, validation: list[Example], train: list[Example]):
    (folder / "qasper").mkdir(parents=True)
    for split, examples in (("validation", validation), ("train", train)):
        rows = [{"id": e.id, "pid": f"{e.id}_0", "input": f"{e.question}\n\n{e.document}", "output": e.references[0]}
                for e in examples]  # fmt: skip
        (folder / "qasper" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


SHOT_TURNS = "<|user|>They leave Kellynch for Bath. Q: Where do they go? A:</s><|assistant|>Bath</s>"
FIRST_TURN = "<|user|>Anne Elliot is the second daughter. Q: Who is Anne? A:</s><|assistant|>"
SINGLE = ("<|user|>They leave Kellynch for Bath. Q: Where do they go? A: Bath\n\n"
          "Anne Elliot is the second daughter. Q: Who is Anne? A:</s><|assistant|>")  # fmt: skip


@pytest.mark.parametrize(("shots", "multiturn", "expected", "prefix"), [
    (0, None, f"<|system|>Be brief.</s>{FIRST_TURN}", "<|system|>Be brief.</s><|user|>"),
    (1, None, f"<|system|>Be brief.</s>{SHOT_TURNS}{FIRST_TURN}", f"<|system|>Be brief.</s>{SHOT_TURNS}<|user|>"),
    (1, False, f"<|system|>Be brief.</s>{SINGLE}", "<|system|>Be brief.</s><|user|>They leave Kellynch for Bath. Q: "
     "Where do they go? A: Bath\n\n"),
])  # fmt: skip
def test_prompts_are_the_templates_turns_and_the_prefix_is_read_once(monkeypatch, tmp_path, chat_model, shots,
                                                                     multiturn, expected, prefix):  # fmt: skip
    second = Example("v2", "Whose daughter?", "Sir Walter has three daughters.", ["Sir Walter's"])
    data = write_data(tmp_path / "data", [FIRST, second], [SHOT])
    settings = ScrollsSettings(model=chat_model, tasks="qasper", data_dir=str(data), shots=shots, max_new_tokens=2,
                               chat_template="default", system_instruction="Be brief.",
                               fewshot_as_multiturn=multiturn, out=str(tmp_path / "r.json"))  # fmt: skip
    assert settings.fewshot_as_multiturn is (multiturn is not False)  # on by default with a template
    report, seen = run_recording(monkeypatch, settings)
    recorded = report["settings"]
    assert recorded["per_task"]["qasper"]["first_prompt"] == expected
    assert (recorded["chat_template"], recorded["system_instruction"]) == ("default", "Be brief.")
    assert recorded["fewshot_as_multiturn"] is settings.fewshot_as_multiturn
    assert recorded["chat_template_effective"] == {"name": "default", "sha256": hashlib.sha256(TEMPLATE.encode())
                                                   .hexdigest(), "system_turn_dropped": False}  # fmt: skip
    assert recorded["bos_effective"] is False  # the tokenizer's default: no BOS
    tok = seen["tokenizer"]
    assert seen["prefix"] == [tok.encode(prefix)]  # the system turn, the exemplar turns, the last user header
    second_text = expected.removeprefix(prefix).replace(FIRST.document, second.document)
    second_text = second_text.replace(FIRST.question, second.question)
    assert [ids for ids, _ in seen["prompt"]] == [tok.encode(expected.removeprefix(prefix)), tok.encode(second_text)]


def test_a_long_document_is_cut_to_fit_the_template_and_question_intact(monkeypatch, tmp_path, chat_model):
    text = (AUSTEN / "persuasion.txt").read_text(encoding="utf-8")
    long = Example("v1", "Who is Sir Walter?", text[:4000], ["a baronet"])
    shot = Example("t1", "Where do they go?", text[5000:7000], ["Bath"])
    data = write_data(tmp_path / "data", [long], [shot])
    settings = ScrollsSettings(model=chat_model, model_args={"max_context": 300}, tasks="qasper", data_dir=str(data),
                               shots=1, max_new_tokens=4, chat_template="default", system_instruction="Be brief.",
                               out=str(tmp_path / "r.json"), samples=str(tmp_path / "s.jsonl"))  # fmt: skip
    report, seen = run_recording(monkeypatch, settings)
    (sample,) = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    (prefix,), ((ids, _),) = seen["prefix"], seen["prompt"]
    assert sample["prompt_tokens"] == len(prefix) + len(ids) <= 300 - 4  # prompt + max_new_tokens fit max_context
    assert sample["prompt_tokens"] >= 300 - 4 - 3  # the example got the rest
    assert sample["truncated_tokens"] > 0 and sample["exemplar_truncated_tokens"][0] > 0
    first = report["settings"]["per_task"]["qasper"]["first_prompt"]
    tok = seen["tokenizer"]
    head, _, own = first.partition("</s><|user|>" + long.document[:30])
    assert tok.encode(head + "</s><|user|>") == prefix and tok.encode(long.document[:30] + own) == ids
    assert head.startswith("<|system|>Be brief.</s><|user|>" + shot.document[:30])  # cut in the middle
    assert head.endswith(shot.document[-20:] + " Q: Where do they go? A:</s><|assistant|>Bath")
    assert own.endswith(long.document[-20:] + " Q: Who is Sir Walter? A:</s><|assistant|>")
    fit = report["settings"]["per_task"]["qasper"]["context_fit"]
    fixed = len(tok.encode("<|system|>Be brief.</s><|user|> Q: Where do they go? A:</s><|assistant|>Bath</s>"
                           "<|user|>"))  # fmt: skip
    reserve = len(tok.encode(" Q: Who is Sir Walter? A:</s><|assistant|>"))
    assert (fit["prefix_fixed_tokens"], fit["example_reserve"], fit["prefix_shared"]) == (fixed, reserve, True)
    assert fit["document_share"] == (296 - fixed - reserve) // 2


def test_a_template_that_writes_earlier_turns_per_question_has_each_prompt_read_whole():
    lm = load_model("embedded:transformer-tiny")
    lm.tokenizer.tok.chat_template = "[{{ messages[-1]['content'][-3:] }}]" + TEMPLATE  # the last turn comes first
    chat = select_template(lm, None)
    form = PromptForm(SCROLLS, [SHOT], chat=chat, fmt=ChatFormat("default", None, True))
    assert not shares_prefix(form, [FIRST.question, "Why?"])
    form = replace(form, shared=False)
    fit = fit_few_shot(lm.tokenizer, form, [], 512, 4, "middle", 40)
    assert fit.ids == [] and fit.budget == 508 and fit.facts is not None and fit.facts["prefix_shared"] is False
    whole = f"[ A:]{SHOT_TURNS}{FIRST_TURN}"
    assert fit_prompt(lm, fit.form, FIRST, fit.budget, "middle") == (lm.tokenizer.encode(whole), 0)
    bos_text = str(lm.tokenizer.tok.bos_token)  # BOS as lm-eval decides: none before a text that starts with it
    lm.tokenizer.adds_bos = True
    assert chat_bos(lm, "auto", opening(PromptForm(SCROLLS, [], chat=chat, fmt=form.fmt), _task(FIRST))) is True
    lm.tokenizer.tok.chat_template = "{{ bos_token }}" + TEMPLATE
    text = opening(PromptForm(SCROLLS, [], chat=select_template(lm, None), fmt=form.fmt), _task(FIRST))
    assert text.startswith(bos_text) and not chat_bos(lm, "auto", text)


def _task(example: Example):
    from megaeval.tasks.scrolls.prepare import ScrollsTask

    return ScrollsTask("qasper", {"template": SCROLLS}, [example], [example.question], [])


def test_chat_flags_are_refused_in_one_line_where_they_cannot_apply(tmp_path):
    data = write_data(tmp_path / "data", [FIRST], [SHOT])
    out = tmp_path / "r.json"
    base = dict(tasks="qasper", data_dir=str(data), shots=0, max_new_tokens=2, out=str(out))
    for settings, message in [
        (dict(model="embedded:transformer-tiny", chat_template="default"),
         "transformer-tiny has no chat template; drop --chat-template"),
        (dict(predictions=str(tmp_path / "p.jsonl"), chat_template="default"),
         "so --chat-template would be ignored; drop --chat-template, or drop --predictions"),
    ]:  # fmt: skip
        with pytest.raises(MegaevalError) as refused:
            run_scrolls(ScrollsSettings(**base, **settings), progress=False)
        assert message in str(refused.value) and "\n" not in str(refused.value) and not out.exists()
    with pytest.raises(MegaevalError, match=r"^--fewshot-as-multiturn puts exemplars in chat turns, but no "
                       r"--chat-template is given; add --chat-template") as refused:  # fmt: skip
        ScrollsSettings(**base, fewshot_as_multiturn=True)
    assert "\n" not in str(refused.value)


def test_a_system_instruction_without_a_template_goes_before_the_prompt_as_lm_eval_joins_it():
    form = PromptForm(SCROLLS, [SHOT], fmt=ChatFormat(None, "Be brief.\n", False))
    assert not form.plain and shares_prefix(form, [FIRST.question])
    assert form.prefix() == "Be brief.\nThey leave Kellynch for Bath. Q: Where do they go? A: Bath\n\n"
    assert form.text(FIRST) == "Anne Elliot is the second daughter. Q: Who is Anne? A:"
    plain = PromptForm(SCROLLS, [SHOT])  # no flag: the SCROLLS text, as before
    assert plain.prefix() + plain.text(FIRST) == form.prefix().removeprefix("Be brief.\n") + form.text(FIRST)
