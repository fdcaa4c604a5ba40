"""BABILong's prompts, byte for byte: the task files hold the official prompts (every task, every combination of
the instruction, examples and post-prompt flags equals BABILong's own `get_formatted_input` with `DEFAULT_PROMPTS`:
tests/fixtures/babilong/reference/prompts.json), and the ids a model reads equal those BABILong's own script feeds a
model, plain and through a chat template (reference/pipeline/inputs.json, made by data_prep/babilong_reference.py
running scripts/run_model_on_babilong.py on the frozen-layout fixture)."""

from __future__ import annotations

import json

import pytest

from megaeval import load_model
from megaeval.commands.babilong import BabilongSettings, check_model
from megaeval.errors import MegaevalError
from megaeval.scoring.chat import select_template
from megaeval.scoring.requests import prompt_encoder
from megaeval.tasks.babilong.prompts import PromptParts, format_prompt
from megaeval.tasks.babilong.spec import check_babilong_spec, load_babilong_task, parse_lengths
from megaeval.tasks.specs import list_tasks
from megaeval_testing import REPO

FIXTURES = REPO / "tests" / "fixtures" / "babilong"
REFERENCE = json.loads((FIXTURES / "reference" / "prompts.json").read_text())
PIPELINE = FIXTURES / "reference" / "pipeline"


def test_the_suite_has_babilongs_twenty_tasks():
    assert list_tasks("babilong") == sorted(f"qa{n}" for n in range(1, 21))
    assert sorted(REFERENCE["prompts"]) == sorted(list_tasks("babilong"))


@pytest.mark.parametrize("task", [f"qa{n}" for n in range(1, 21)])
def test_prompts_equal_get_formatted_input_for_every_flag_combination(task):
    spec = load_babilong_task(task)
    for name, expected in REFERENCE["prompts"][task].items():
        flags = dict(zip(("instruction", "examples", "post_prompt"), (f"{p}_yes" in name for p in
                         ("instruction", "examples", "post_prompt")), strict=True))  # fmt: skip
        parts = PromptParts(**flags)
        got = [format_prompt(spec, context, question, parts) for context, question in REFERENCE["contexts"]]
        assert got == expected, (task, name)


def test_prompt_names_are_the_official_scripts():
    assert PromptParts().name == "instruction_yes_examples_yes_post_prompt_yes_chat_template_no_system_prompt_no"
    assert PromptParts(examples=False, chat_template=True).name == (
        "instruction_yes_examples_no_post_prompt_yes_chat_template_yes_system_prompt_no"
    )
    written = {p.stem.split("_", 2)[2] for p in (PIPELINE / "model").glob("*.csv")}
    assert written == {PromptParts().name, PromptParts(chat_template=True).name}


@pytest.fixture(scope="module")
def tiny():
    """embedded:transformer-tiny with the chat template the official run rendered."""
    lm = load_model("embedded:transformer-tiny")
    lm.tokenizer.tok.chat_template = (PIPELINE / "TEMPLATE.jinja").read_text()
    return lm


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_ids_equal_what_babilongs_script_feeds_the_model(tiny, chat):
    """The official script tokenizes a plain prompt with the tokenizer's special tokens and a chat one with the
    template's text only (no BOS added): megaeval's ids for the same instances are those ids."""
    inputs = json.loads((PIPELINE / "inputs.json").read_text())
    settings = BabilongSettings(data=str(FIXTURES / "frozen"), lengths="0k", chat_template="default" if chat else None)
    chosen = check_model(tiny, settings)
    assert chosen["bos_effective"] is False
    template = select_template(tiny, "default") if chat else None
    encode = prompt_encoder(tiny, chosen["bos_effective"], settings.chat, template)
    compared = 0
    for key, expected in inputs.items():
        kind, task, length = key.split("/")
        if kind != ("chat" if chat else "plain"):
            continue
        records = json.loads((FIXTURES / "frozen" / task / f"{length}.json").read_text())
        spec = load_babilong_task(task)
        for record, ids in zip(records, expected, strict=True):
            text = format_prompt(spec, record["input"], record["question"], settings.parts)
            assert encode(text, "")[0].tolist() == ids, key
            compared += 1
    assert compared == 20


def test_a_system_instruction_is_refused_as_the_official_path_drops_it():
    with pytest.raises(MegaevalError, match="drops any system prompt"):
        BabilongSettings(data=str(FIXTURES / "frozen"), chat_template="default", system_instruction="Be brief.")


def test_lengths_are_the_sets_config_names():
    assert parse_lengths("0k,1K,128k,1m,10M,1k") == ["0k", "1k", "128k", "1M", "10M"]
    for bad in ("4096", "1g", "k", ""):
        with pytest.raises(MegaevalError):
            parse_lengths(bad)


@pytest.mark.parametrize(("change", "message"), [
    ({"labels": []}, "`labels` must be a non-empty list"),
    ({"template": "{context} {question} {answer}"}, "unknown placeholder {answer}"),
    ({"template": "{context}"}, "must hold {question} exactly once"),
    ({"template": "{context} {question"}, "is not a valid template"),
    ({"max_new_tokens": 0}, "at least 1"),
    ({"examples": None}, "must be a text"),
    ({"answer": "x"}, "is not a field"),
])  # fmt: skip
def test_a_broken_task_file_is_one_line_naming_the_field(change, message):
    spec = {**load_babilong_task("qa1"), **change}
    with pytest.raises(MegaevalError, match=message):
        check_babilong_spec(spec, "mine.yaml")
