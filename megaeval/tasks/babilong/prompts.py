"""BABILong prompts as booydar/babilong writes them (babilong/prompts.py `get_formatted_input`, 7a6efee): the task's
instruction, examples and post-prompt (each dropped with --no-instruction, --no-examples, --no-post-prompt, as the
official flags drop them) and the instance's context and question, filled into the task's template and stripped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PARTS = ("instruction", "examples", "post_prompt")


@dataclass(frozen=True)
class PromptParts:
    """Which of the task's prompt parts a run uses (the official --use_instruction, --use_examples,
    --use_post_prompt) and whether it renders the chat template."""

    instruction: bool = True
    examples: bool = True
    post_prompt: bool = True
    chat_template: bool = False

    @property
    def name(self) -> str:
        """The official run's prompt_name, as scripts/run_model_on_babilong.py (7a6efee) names its prediction files:
        `instruction_yes_examples_yes_post_prompt_yes_chat_template_no_system_prompt_no` (megaeval's runs have no
        system prompt; files from before August 2024 end at `..._chat_template_no` or `..._post_prompt_yes`)."""
        flags = {**{p: getattr(self, p) for p in PARTS}, "chat_template": self.chat_template, "system_prompt": False}
        return "_".join(f"{k}_{'yes' if v else 'no'}" for k, v in flags.items())


def format_prompt(spec: dict[str, Any], context: str, question: str, parts: PromptParts = PromptParts()) -> str:
    """One instance's prompt: `template.format(...)` with the parts in use (the others empty), the context stripped,
    the whole stripped."""
    used = {p: spec[p] if getattr(parts, p) else "" for p in PARTS}
    return spec["template"].format(**used, context=context.strip(), question=question).strip()
