"""How RULER's generators fit a haystack to a length: a binary search over haystack sizes, then per sample a draw
that shrinks the haystack by `incremental` items until the prompt fits. Both draw from the random stream at every
step, so the steps (and their number) are part of what RULER's seed produces.

Follows NVIDIA/RULER scripts/data/synthetic/niah.py and variable_tracking.py (`generate_samples`,
`sys_vartrack_w_noise_random`) at commit c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a. Where RULER loops forever
(its `while True: try ... except` when no draw of the smallest haystack fits), this stops with one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ...errors import fail

T = TypeVar("T")

# Where RULER redraws the smallest haystack forever, give up after MAX_DRAWS_AT_SMALLEST draws, or after
# MIN_DRAWS_AT_SMALLEST once the shortest draw overshoots by more than the draws' spread: at a fixed haystack size a
# draw's length varies only by its random keys and values, so such a prompt is too long for the length, not unlucky.
MIN_DRAWS_AT_SMALLEST = 100
MAX_DRAWS_AT_SMALLEST = 1000


class HaystackTooSmall(Exception):
    """A draw needs more haystack positions than the haystack has (where RULER's random.sample raises)."""

    def __init__(self, needed: int, size: int):
        super().__init__(f"{needed} insertions into a haystack of {size}")
        self.needed, self.size = needed, size


def checked_sample_size(needed: int, size: int) -> None:
    """Raise HaystackTooSmall where random.sample(range(size), needed) would raise (before it draws anything)."""
    if needed > size:
        raise HaystackTooSmall(needed, size)


def largest_fitting(total_tokens: Callable[[int], int], low: int, high: int, max_seq_length: int) -> int | None:
    """RULER's binary search: the largest size in [low, high] whose drawn prompt fits, probing as RULER probes."""
    best = None
    while low <= high:
        mid = (low + high) // 2
        if total_tokens(mid) <= max_seq_length:
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best


def estimate(draw_tokens: Callable[[int], int], incremental: int, task: str) -> float:
    """Tokens per haystack item from one draw of `incremental` items (RULER's first draw of a run)."""
    try:
        return draw_tokens(incremental) / incremental
    except HaystackTooSmall as e:
        raise fail(f"RULER's {task} cannot insert {e.needed} items into its smallest haystack of {e.size} "
                   "(RULER itself stops with an error)",
                   "use fewer needles or hops in the task file") from None  # fmt: skip


def draw_fitting(
    attempt: Callable[[int], tuple[T, int]], size: int, incremental: int, max_seq_length: int, task: str,
    fix: str = "use a longer length",
) -> tuple[T, int]:  # fmt: skip
    """One sample as RULER draws it: `attempt(size)` gives (sample, its length); while it does not fit, draw again
    with `incremental` fewer items, and at the smallest size draw again as it is (RULER's bare `except`). Where
    that would go on forever, one line with `fix`."""
    shortest, longest, draws = None, 0, 0  # the lengths drawn at the smallest size
    while True:
        try:
            sample, length = attempt(size)
            if length <= max_seq_length:
                return sample, length
        except HaystackTooSmall as e:
            if size <= incremental:  # the same shortfall at every retry
                raise fail(f"RULER's {task} cannot insert {e.needed} items into its smallest haystack of {e.size} "
                           "(RULER itself would loop forever)", fix) from None  # fmt: skip
            length = None
        if size > incremental:
            size -= incremental
            continue
        assert length is not None
        shortest = length if shortest is None else min(shortest, length)
        longest, draws = max(length, longest), draws + 1
        if draws == MAX_DRAWS_AT_SMALLEST or (
            draws >= MIN_DRAWS_AT_SMALLEST and shortest - max_seq_length > longest - shortest
        ):
            raise fail(f"RULER's {task} does not fit in {max_seq_length} tokens: {draws} draws of its smallest "
                       f"haystack ({size} items) all came out longer (the shortest {shortest} tokens, generation "
                       "included; RULER itself would loop forever)", fix)  # fmt: skip


def ruler_record(index: int, text: str, outputs: list[str], length: int, answer_prefix: str) -> dict[str, object]:
    """RULER's record of one sample (vt, cwe, fwe, qa): the prompt cut where the first 10 characters of the answer
    prefix last occur (nowhere: RULER's rfind gives -1 and cuts off the last character), RULER's fields in order."""
    cut = text.rfind(answer_prefix[:10])
    return {
        "index": index,
        "input": text[:cut],
        "outputs": outputs,
        "length": length,
        "length_w_model_temp": length,  # + RULER's model_template_token, 0 outside NeMo-Skills
        "answer_prefix": text[cut:],
    }
