"""Academic documents as lm-evaluation-harness 0.4.13 writes them with --apply_chat_template (or with a
--system-instruction in base mode): the prompt's parts (`docs.Turns`) rendered by `scoring.chat`.

With a template, a multiple-choice continuation loses its target delimiter (lm_eval/api/task.py
`construct_requests`: the delimiter stays only after a gen_prefix that does not end in whitespace; these tasks have
none): the rendered context ends with the assistant header and the choice follows it directly.
"""

from __future__ import annotations

from dataclasses import replace

from ...scoring.chat import ChatFormat, ChatTemplate, conversation, render_turns
from .docs import Doc
from .prepare import AcademicTask


def chat_docs(task: AcademicTask, template: ChatTemplate | None, fmt: ChatFormat) -> list[Doc]:
    """The task's documents with their contexts rendered (and continuations as the harness continues them)."""
    chosen = task.chosen
    delimiter = "" if template is not None else chosen["target_delimiter"]
    docs = []
    for doc in task.docs:
        parts = doc.turns
        contexts = [
            render_turns(template, conversation(q, parts.exemplars, parts.description, fmt, chosen["target_delimiter"],
                                                chosen["fewshot_delimiter"]), fmt.fewshot_as_multiturn)
            for q in parts.questions
        ]  # fmt: skip
        continuations = [delimiter + a for a in parts.answers]
        at = contexts[0].rfind(parts.questions[0])  # the start shared by documents with the same exemplars
        docs.append(replace(doc, contexts=contexts, continuations=continuations, fewshot=contexts[0][: max(at, 0)]))
    return docs
