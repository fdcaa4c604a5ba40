"""MRCR's scores of one response: OpenAI MRCR's (the openai/mrcr dataset card's `grade()`, to the letter) and GDM
MRCR v2's (`mrcr_v2_metric` of google-deepmind/eval_hub's eval_hub/mrcr_v2/run_evaluation.py at 67b7fd2).

`grade`: the response must start with the record's random string (exactly: a leading space or newline before it
scores 0); the string is then removed from the start of both the response and the answer (`str.removeprefix`), and
the score is `difflib.SequenceMatcher(None, response, answer).ratio()` (autojunk on, as the card leaves it).
Nothing is stripped: `strip=True` (`--strip`) strips the response's surrounding whitespace first, as some ports do.
"""

from __future__ import annotations

from difflib import SequenceMatcher


def grade(response: str, answer: str, random_string_to_prepend: str, strip: bool = False) -> float:
    """The card's grade: 0.0 without the prefix, else the SequenceMatcher ratio of the texts after it."""
    if strip:
        response = response.strip()
    if not response.startswith(random_string_to_prepend):
        return 0.0
    response = response.removeprefix(random_string_to_prepend)
    answer = answer.removeprefix(random_string_to_prepend)
    return float(SequenceMatcher(None, response, answer).ratio())


HASH = 12  # GDM v2's random strings are 12 characters


def mrcr_v2_metric(prediction: str, target: str) -> float:
    """GDM MRCR v2's score: 0.0 for an empty prediction or a target shorter than its hash; else the target stripped,
    its first 12 characters the random string and the rest (stripped) the reference; the prediction stripped, the
    text after the *last* occurrence of the random string anywhere in it (0.0 when there is none) stripped, and
    `difflib.SequenceMatcher(a=reference, b=that text).ratio()` (the reference first, as GDM orders them). Its
    docstring says the random string must be the first 12 characters; its code, followed here, takes it anywhere."""
    if not isinstance(prediction, str) or not prediction:
        return 0.0
    target = target.strip()
    if len(target) < HASH:
        return 0.0
    random_string, reference = target[:HASH], target[HASH:].strip()
    at = prediction.strip().rfind(random_string)
    if at == -1:
        return 0.0
    return SequenceMatcher(a=reference, b=prediction.strip()[at + HASH :].strip()).ratio()
