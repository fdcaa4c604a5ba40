"""Prompts for instruction-tuned models, as lm-evaluation-harness 0.4.13 renders them with --apply_chat_template.

The one home of chat formatting for every command. Facts from lm-eval 0.4.13:

- `lm_eval/api/utils.py`: `Message(role, content, _delimiter)` renders as text `content + _delimiter` and as a
  chat turn `{role, content}`; `maybe_delimit` joins with a delimiter only where neither side has whitespace at the
  join; `multiturn_to_singleturn` folds every turn but the system turn (and a final assistant turn) into one user
  turn of their texts, the last one's delimiter dropped.
- `lm_eval/api/task.py` `ConfigurableTask.fewshot_context`: a system turn of `maybe_delimit(system_instruction,
  description, fewshot_delimiter)`; each exemplar a user turn (its question, target delimiter as its text
  delimiter) and an assistant turn (its answer after `maybe_delimit(gen_prefix, ...)`, few-shot delimiter); then the
  document's question as a user turn, and its `gen_prefix` as a final assistant turn (`build_qa_turn`). With a
  template, the turns are rendered as they are (`--fewshot_as_multiturn`) or folded into one user turn, with
  `add_generation_prompt = not gen_prefix` and `continue_final_message` its opposite.
- `lm_eval/models/huggingface.py` `apply_chat_template`: a template that raises a jinja2 TemplateError is tried
  again without the system turn (templates without a system role); `lm_eval/api/model.py` `chat_template`: a
  tokenizer with a dict of templates needs a name (or has "default"); `tok_encode`: a text that already starts with
  the BOS text gets no special tokens, any other the tokenizer's default.
- `lm_eval/config/evaluate_config.py`: `fewshot_as_multiturn` is on by default with a chat template and refused
  without one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ..errors import fail
from ..models.base import StreamingLM
from .bos import resolve_bos


@dataclass(frozen=True)
class ChatFormat:
    """The chat flags of a command: `template` None is base-model mode, "" the tokenizer's template, else a name."""

    template: str | None = None
    system_instruction: str | None = None
    fewshot_as_multiturn: bool = False

    @property
    def on(self) -> bool:
        """Whether prompts go through a chat template."""
        return self.template is not None


BASE = ChatFormat()  # base-model mode: no template, no system instruction
PROBE = "Is this question kept? 7461"  # the user text a template is probed with once per run


def chat_format(template: str | None, system_instruction: str | None, fewshot_as_multiturn: bool | None) -> ChatFormat:
    """The flags checked: --fewshot-as-multiturn needs --chat-template and is on with it unless turned off."""
    if fewshot_as_multiturn and template is None:
        raise fail("--fewshot-as-multiturn puts exemplars in chat turns, but no --chat-template is given",
                   "add --chat-template, or drop --fewshot-as-multiturn")  # fmt: skip
    if system_instruction is not None and not system_instruction.strip():
        raise fail("--system-instruction is empty", "give it a text, or drop it")
    multiturn = template is not None if fewshot_as_multiturn is None else fewshot_as_multiturn
    return ChatFormat(template, system_instruction, multiturn)


@dataclass(kw_only=True)
class ChatFlags:
    """The chat flags every command shares (a mixin of its settings): --chat-template [NAME] ("default": the
    tokenizer's template), --system-instruction, --fewshot-as-multiturn (None: on with a template)."""

    chat_template: str | None = None
    system_instruction: str | None = None
    fewshot_as_multiturn: bool | None = None

    def check_chat(self) -> None:
        """Refuse impossible combinations; settle --fewshot-as-multiturn to what the run does."""
        self.fewshot_as_multiturn = chat_format(self.chat_template, self.system_instruction,
                                                self.fewshot_as_multiturn).fewshot_as_multiturn  # fmt: skip

    @property
    def chat(self) -> ChatFormat:
        """The chat flags as one value."""
        return ChatFormat(self.chat_template, self.system_instruction, bool(self.fewshot_as_multiturn))


@dataclass
class Message:
    """One turn: its role, its text, and what follows it when turns are joined as plain text."""

    role: str
    content: str
    delimiter: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}

    def to_text(self) -> str:
        return self.content + self.delimiter


def maybe_delimit(prefix: str | None, suffix: str | None, delimiter: str = " ") -> str:
    """`prefix` and `suffix` joined, with `delimiter` only where neither has whitespace at the join."""
    if not prefix:
        return suffix or ""
    if not suffix:
        return prefix
    return prefix + suffix if prefix[-1].isspace() or suffix[0].isspace() else prefix + delimiter + suffix


def qa_turn(
    question: str, answer: str | None = None, gen_prefix: str | None = None, target_delimiter: str = " ",
    fewshot_delimiter: str = "\n\n",
) -> list[Message]:  # fmt: skip
    """A question as a user turn, then its answer (an exemplar) or its `gen_prefix` as an assistant turn."""
    joins = gen_prefix and question and not (question[-1].isspace() or gen_prefix[0].isspace())
    user = Message("user", question, target_delimiter if (answer and not gen_prefix) or joins else "")
    if answer:
        return [user, Message("assistant", maybe_delimit(gen_prefix, answer), fewshot_delimiter)]
    return [user, Message("assistant", gen_prefix)] if gen_prefix else [user]


def conversation(
    question: str, exemplars: list[tuple[str, str]] = (), description: str = "", fmt: ChatFormat = BASE,
    target_delimiter: str = " ", fewshot_delimiter: str = "\n\n", gen_prefix: str | None = None,
) -> list[Message]:  # fmt: skip
    """The turns of one prompt in lm-eval's order: system (instruction and description), the exemplars' questions
    and answers, the question (and its gen_prefix)."""
    system = maybe_delimit(fmt.system_instruction, description, fewshot_delimiter)
    turns = [Message("system", system)] if system else []
    for q, a in exemplars:
        turns += qa_turn(q, a, gen_prefix, target_delimiter, fewshot_delimiter)
    return turns + qa_turn(question, None, gen_prefix, target_delimiter, "")


def single_turn(turns: list[Message]) -> list[dict[str, str]]:
    """The turns folded as lm-eval folds them without --fewshot-as-multiturn: system, one user turn of every other
    turn's text (the last one's delimiter dropped), and a final assistant turn kept as it is."""
    system, rest = (turns[0], turns[1:]) if turns and turns[0].role == "system" else (None, list(turns))
    last = rest[-1] if rest and rest[-1].role == "assistant" else None
    body = rest[:-1] if last else rest
    text = "".join(m.to_text() for m in body[:-1]) + body[-1].content
    folded = [Message("user", text).to_dict()] + ([last.to_dict()] if last else [])
    return [system.to_dict(), *folded] if system else folded


@dataclass
class ChatTemplate:
    """The chat template a run renders with: the tokenizer's, or the named one of several."""

    name: str  # "default" for the tokenizer's only (or default) template
    text: str
    tok: Any  # the transformers tokenizer that renders it
    system_dropped: bool = field(default=False)  # a system turn was dropped (a template without a system role)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def facts(self) -> dict[str, Any]:
        """What a report records of the template."""
        return {"name": self.name, "sha256": self.sha256, "system_turn_dropped": self.system_dropped}

    def render(self, turns: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The turns as the template writes them (no tokens): a generation prompt, or the last turn continued. A
        system turn the template drops (raising on it, as lm-eval then renders without it, or skipping it) is
        recorded in `system_dropped`."""
        try:
            text = self._render(turns, add_generation_prompt)
        except Exception as e:
            if type(e).__module__.split(".")[0] != "jinja2" or not any(t["role"] == "system" for t in turns):
                raise self._broken(e) from None
            self.system_dropped = True  # as lm-eval does for templates that raise on a system turn
            try:
                return self._render([t for t in turns if t["role"] != "system"], add_generation_prompt)
            except Exception as again:
                raise self._broken(again) from None
        if any(t["role"] == "system" and t["content"].strip() not in text for t in turns):
            self.system_dropped = True  # rendered without raising, but without the system text
        return text

    def probe(self, system: str | None = None) -> ChatTemplate:
        """The template itself, after checking once that it writes a user's text into the prompt (a template that
        renders only role markers would have every prompt scored without its task) and whether it keeps the
        `system` instruction (`system_dropped` then says so)."""
        text = self.render(
            ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": PROBE}]
        )
        if not isinstance(text, str) or PROBE not in text:
            raise fail(f"--chat-template: the chat template {self.name!r} drops the user's text (a user turn "
                       f"{PROBE!r} renders as {str(text)[:60]!r})",
                       "fix the template in its tokenizer_config.json, or drop --chat-template")  # fmt: skip
        return self

    def _render(self, turns: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(turns, chat_template=self.text, tokenize=False,
                                            add_generation_prompt=add_generation_prompt,
                                            continue_final_message=not add_generation_prompt)  # fmt: skip

    def _broken(self, e: Exception) -> Exception:
        """Any error the template raises as one line (a template is code the user brought: a TypeError in it is
        their input's fault, not megaeval's)."""
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return fail(f"--chat-template: the chat template {self.name!r} cannot be rendered ({type(e).__name__}: "
                    f"{reason})", "fix the template in its tokenizer_config.json, or drop --chat-template")  # fmt: skip


def select_template(lm: StreamingLM, name: str | None, system: str | None = None) -> ChatTemplate:
    """The model's chat template (`name` "" or None: its only or default one), refused in one line when absent or
    when it drops the user's text; probed once for whether it keeps the `system` instruction."""
    tok = getattr(lm.tokenizer, "tok", None)
    templates = getattr(tok, "chat_template", None)
    if not templates:
        raise fail(f"--chat-template: the tokenizer of {lm.spec} has no chat template",
                   "drop --chat-template (a base model reads the prompt as it is)")  # fmt: skip
    if isinstance(templates, dict):
        names = ", ".join(sorted(map(str, templates)))
        chosen = name or ("default" if "default" in templates else None)
        if chosen is None:
            raise fail(f"--chat-template: the tokenizer of {lm.spec} has several chat templates ({names}) and no "
                       "default", "name one: --chat-template NAME")  # fmt: skip
        if chosen not in templates:
            raise fail(f"--chat-template {chosen}: the tokenizer of {lm.spec} has no template of that name",
                       f"use one of: {names}")  # fmt: skip
        return ChatTemplate(chosen, _template_text(templates[chosen], chosen, lm), tok).probe(system)
    if name and name != "default":
        raise fail(f"--chat-template {name}: the tokenizer of {lm.spec} has one chat template, without a name",
                   "pass --chat-template without a name")  # fmt: skip
    return ChatTemplate("default", _template_text(templates, "default", lm), tok).probe(system)


def run_template(lm: StreamingLM, chat: ChatFormat) -> ChatTemplate | None:
    """The template a run's prompts render with (None in base mode), selected and probed once."""
    return select_template(lm, chat.template, chat.system_instruction) if chat.on else None


def _template_text(template: Any, name: str, lm: StreamingLM) -> str:
    if not isinstance(template, str) or not template.strip():
        raise fail(f"--chat-template: the chat template {name!r} of {lm.spec} is {type(template).__name__} "
                   f"{str(template)[:40]!r}, not a Jinja template text",
                   "fix chat_template in its tokenizer_config.json, or drop --chat-template")  # fmt: skip
    return template


def render_turns(template: ChatTemplate | None, turns: list[Message], multiturn: bool) -> str:
    """A prompt's text: its turns joined as plain text (base mode), or rendered by the template (as they are with
    `multiturn`, else folded into one user turn), continuing a final assistant turn (a gen_prefix)."""
    if template is None:
        return "".join(m.to_text() for m in turns)
    dicts = [m.to_dict() for m in turns] if multiturn else single_turn(turns)
    return template.render(dicts, add_generation_prompt=turns[-1].role != "assistant")


def writes_bos(lm: StreamingLM, text: str) -> bool:
    """Whether a rendered prompt already starts with the BOS token's text (a template that writes its own)."""
    bos_text = getattr(getattr(lm.tokenizer, "tok", None), "bos_token", None)
    return bool(bos_text) and text.startswith(str(bos_text))


def chat_bos(lm: StreamingLM, policy: str, text: str) -> bool:
    """BOS before a rendered prompt: under auto, the tokenizer's default unless the template writes it, as lm-eval's
    tok_encode decides; always/never as asked."""
    if policy != "auto":
        return resolve_bos(lm, policy)
    return resolve_bos(lm, "auto") and not writes_bos(lm, text)


def turn_end_ids(lm: StreamingLM) -> tuple[int, ...]:
    """The ids besides the tokenizer's EOS that end a chat model's turn, as `generate` stops at them: a transformers
    model's generation_config.json `eos_token_id` list (Llama 3's <|eot_id|>, say); none for other models."""
    config = getattr(getattr(lm, "model", None), "generation_config", None)
    ids = getattr(config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return tuple(int(i) for i in ids if isinstance(i, int) and i != lm.tokenizer.eos_id)
