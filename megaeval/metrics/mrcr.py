"""OpenAI MRCR's score of one response: the openai/mrcr dataset card's `grade()`, to the letter.

The response must start with the record's random string (exactly: a leading space or newline before it scores 0);
the string is then removed from the start of both the response and the answer (`str.removeprefix`), and the score
is `difflib.SequenceMatcher(None, response, answer).ratio()` (autojunk on, as the card leaves it). Nothing is
stripped: `strip=True` (`--strip`) strips the response's surrounding whitespace first, as some ports do.
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
