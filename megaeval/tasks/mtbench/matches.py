"""What a judge is asked, as FastChat's gen_judgment.py --mode single asks it: for every question and model, turn 1
with single-v1 (single-math-v1 and the reference answer's first turn for math, reasoning and coding), and turn 2
with the multi-turn prompts (only for questions of exactly two turns), in gen_judgment.py's order: default turn 1,
reference turn 1, default turn 2, reference turn 2; the template's fields filled as run_judge_single fills them."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import fail
from .data import NEED_REF_CATS, Answers, Question, key

# gen_judgment.py's make_judge_single: (needs the reference, multi-turn) -> the judge prompt's name
PROMPTS = {(False, False): "single-v1", (True, False): "single-math-v1", (False, True): "single-v1-multi-turn",
           (True, True): "single-math-v1-multi-turn"}  # fmt: skip


@dataclass(frozen=True)
class Match:
    """One judgment to make: the question, the model judged, the turn (2: the multi-turn prompt), the judge prompt's
    name and the fields its template is filled with."""

    question: Question
    model: str
    turn: int
    prompt: str
    fields: dict[str, str]

    @property
    def unit(self) -> list:
        """Its key in a run's journal."""
        return ["judge", self.model, self.question.question_id, self.turn]


def make_matches(questions: list[Question], answers: list[Answers], reference: Answers | None) -> list[Match]:
    """Every single-answer judgment of `answers` (one model each) on `questions`, in gen_judgment.py's order."""
    matches = []
    for multi_turn in (False, True):
        for with_ref in (False, True):
            for q in questions:
                if (q.category in NEED_REF_CATS) != with_ref or (multi_turn and len(q.turns) != 2):
                    continue
                ref = reference_turns(reference, q) if with_ref else None
                for a in answers:
                    fields = _fields(q, a.turns[key(q.question_id)], ref, multi_turn)
                    matches.append(Match(q, a.model, 2 if multi_turn else 1, PROMPTS[with_ref, multi_turn], fields))
    return matches


def check_references(questions: list[Question], reference: Answers | None) -> None:
    """Refuse, before any work, questions judged against a reference answer that `reference` lacks."""
    for q in questions:
        if q.category in NEED_REF_CATS:
            reference_turns(reference, q)


def reference_turns(reference: Answers | None, question: Question) -> tuple[str, ...]:
    """The reference answer's turns for a question that needs one, or one line naming what is missing."""
    if reference is None:
        raise fail(f"question {question.question_id!r} ({question.category}) is judged against a reference answer, and "
                   "there is none", "pass --reference NAME with --data DIR/reference_answer/NAME.jsonl")  # fmt: skip
    turns = reference.turns.get(key(question.question_id))
    if turns is None or len(turns) < min(len(question.turns), 2):
        raise fail(f"reference answers {reference.path} have no answer to every turn of question "
                   f"{question.question_id!r} ({question.category})", "pass reference answers to every "
                   f"{'/'.join(NEED_REF_CATS)} question")  # fmt: skip
    return turns


def _fields(q: Question, answer: tuple[str, ...], ref: tuple[str, ...] | None, multi_turn: bool) -> dict[str, str]:
    """run_judge_single's template fields."""
    fields = {}
    if ref is not None:
        fields["ref_answer_1"] = ref[0]
        if multi_turn:
            fields["ref_answer_2"] = ref[1]
    if multi_turn:
        return {"question_1": q.turns[0], "question_2": q.turns[1], "answer_1": answer[0], "answer_2": answer[1],
                **fields}  # fmt: skip
    return {"question": q.turns[0], "answer": answer[0], **fields}
