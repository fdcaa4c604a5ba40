"""Judge prompts as data, in FastChat's llm_judge format (`judge_prompts.jsonl`: name, type, system_prompt,
prompt_template, output_format, ...), read strictly and rendered as FastChat renders them: the system prompt as the
system turn, the template filled with the question and answers as the one user turn."""

from __future__ import annotations

import hashlib
import json
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import fail
from ..text import iter_jsonl

TYPES = ("single", "pairwise")
FORMATS = {"single": ("[[rating]]",), "pairwise": ("[[A]]", "[[rating_a,rating_b]]")}
FIELDS = ("name", "type", "system_prompt", "prompt_template", "output_format")


@dataclass(frozen=True)
class JudgePrompt:
    """One judge prompt: how its turns are written and how its reply is read (`output_format`)."""

    name: str
    type: str
    system_prompt: str
    prompt_template: str
    output_format: str

    @property
    def placeholders(self) -> tuple[str, ...]:
        """The fields its template asks for ({question}, {answer}, {ref_answer_1}, ...)."""
        return tuple(dict.fromkeys(f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f))

    @property
    def sha256(self) -> str:
        """Checksum of what the judge reads (a report records it)."""
        return hashlib.sha256(json.dumps([self.system_prompt, self.prompt_template]).encode()).hexdigest()

    def render(self, fields: dict[str, str]) -> tuple[dict[str, str], ...]:
        """The judge's turns for `fields`: FastChat's conversation with this system message and one user turn (a
        field the template asks for and `fields` lacks is refused)."""
        missing = [f for f in self.placeholders if f not in fields]
        if missing:
            raise fail(f"judge prompt {self.name} asks for {', '.join(missing)}, which this judging gives it no value "
                       "for", "use a judge prompt whose placeholders this judging fills")  # fmt: skip
        user = self.prompt_template.format(**fields)
        return ({"role": "system", "content": self.system_prompt}, {"role": "user", "content": user})


def builtin_judge_prompts() -> Path:
    """FastChat's judge prompts, shipped (suites/mtbench/judge_prompts.jsonl; source and licence in its README)."""
    return Path(str(resources.files("megaeval.suites").joinpath("mtbench", "judge_prompts.jsonl")))


def load_judge_prompts(path: str | Path | None = None) -> dict[str, JudgePrompt]:
    """The judge prompts of a JSONL file in FastChat's format (None: FastChat's own), by name; each line checked."""
    path = Path(path) if path is not None else builtin_judge_prompts()
    prompts: dict[str, JudgePrompt] = {}
    for number, row in iter_jsonl(path, "judge prompts"):
        where = f"judge prompts {path} line {number}"
        if not isinstance(row, dict):
            raise fail(f"{where} is not a JSON object", "write one judge prompt per line, as FastChat's file does")
        absent = [k for k in FIELDS if not isinstance(row.get(k), str)]
        if absent:
            raise fail(f"{where}: {', '.join(absent)} missing or not text", f"give each of: {', '.join(FIELDS)}")
        if row["type"] not in TYPES:
            raise fail(f"{where}: type {row['type']!r}", f"use one of: {', '.join(TYPES)}")
        if row["output_format"] not in FORMATS[row["type"]]:
            raise fail(f"{where}: output_format {row['output_format']!r} for a {row['type']} prompt",
                       f"use one of: {', '.join(FORMATS[row['type']])}")  # fmt: skip
        prompt = JudgePrompt(**{k: row[k] for k in FIELDS})
        try:  # a placeholder that is not a plain name, or a lone brace, is refused here, not while judging
            prompt.prompt_template.format(**{f: "" for f in prompt.placeholders})
        except (ValueError, IndexError, KeyError) as e:
            raise fail(f"{where}: prompt_template is not a format string ({e})", "escape braces as {{ and }}") from None
        if prompt.name in prompts:
            raise fail(f"{where}: a second judge prompt named {prompt.name!r}", "give each prompt its own name")
        prompts[prompt.name] = prompt
    if not prompts:
        raise fail(f"judge prompts {path} holds no prompt", "pass a file in FastChat's judge_prompts.jsonl format")
    return prompts


def judge_prompt(prompts: dict[str, JudgePrompt], name: str) -> JudgePrompt:
    """The prompt called `name`, or one line naming those there are."""
    if name not in prompts:
        raise fail(f"no judge prompt named {name!r}", f"use one of: {', '.join(prompts)}")
    return prompts[name]


def as_fields(values: dict[str, Any]) -> dict[str, str]:
    """Template fields as text."""
    return {k: str(v) for k, v in values.items()}
