"""RULER's variable tracking generator (its vt task), draw for draw: the same records, in the same order, as RULER's
variable_tracking.py writes for `prepare.py --model_template_type base`, given the same seed and tokenizer.

Follows NVIDIA/RULER scripts/data/synthetic/variable_tracking.py at commit c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a.
RULER seeds the global `random` and `np.random` once per task process; here one `random.Random(seed)` and one
`np.random.RandomState(seed)` are consumed in the same order. The process first makes its worked example (a run of
one sample at 500 tokens, with 3-letter names and the value 12345), then the samples, each preceded by a copy of the
example with fresh names and value.
"""

from __future__ import annotations

import heapq
import string
from dataclasses import dataclass
from random import Random
from typing import Any

import numpy as np

from ...errors import fail
from ..needle.haystack import RULER_DEPTHS as DEPTHS
from .fitting import checked_sample_size, draw_fitting, estimate, largest_fitting, ruler_record
from .inputs import RulerInputs, TokenCounter, essay_words, sent_tokenize
from .niah import NOISE

EXAMPLE_LENGTH = 500  # tokens of RULER's worked example run
EXAMPLE_VALUE = "12345"
# RULER's `incremental` (haystack items of the estimating draw, the search's lower bound, each retry's step): essay
# words or noise lines, in the worked example's run and in the samples' run
EXAMPLE_INCREMENTAL = {"essay": 50, "noise": 5}
INCREMENTAL = {"essay": 500, "noise": 10}
SHORT_INCREMENTAL = 5  # the samples' noise haystack below 4096 tokens
CUTOFF_CHARS = 20  # RULER finds where to insert the example by the template's first 20 characters
EXAMPLE_FIX = f"RULER makes its worked example in {EXAMPLE_LENGTH} tokens at every length: use fewer chains or hops"


@dataclass
class VtRun:
    """One task's generation, as one RULER process holds it: its arguments, random streams and haystack."""

    spec: dict[str, Any]
    count_tokens: TokenCounter
    rng: Random
    np_rng: np.random.RandomState
    haystack: list[str] | None  # essay words; None for the noise haystack
    split: tuple[int, list[str]] | None = None  # the essay's sentences at the size last split

    def sentences(self, num_noises: int) -> list[str]:
        """The first `num_noises` essay words split into sentences; once per size (retries split the same text)."""
        assert self.haystack is not None
        if self.split is None or self.split[0] != num_noises:
            self.split = (num_noises, sent_tokenize(" ".join(self.haystack[:num_noises]).strip()))
        return self.split[1]

    @property
    def args(self) -> dict[str, Any]:
        """The task's arguments, as scripts/synthetic.yaml gives them."""
        return self.spec["args"]


def random_name(run: VtRun, letters: int) -> str:
    """A variable name of `letters` random capitals."""
    return "".join(run.rng.choices(string.ascii_uppercase, k=letters)).upper()


def draw_chains(run: VtRun, is_example: bool) -> tuple[list[list[str]], list[list[str]]]:
    """Each chain's variable names and its statements: a value, then one assignment per hop."""
    num_chains = run.args["num_chains"]
    letters = 3 if is_example else 5
    num_hops = min(10, run.args["num_hops"]) if is_example else run.args["num_hops"]
    names = [random_name(run, letters) for _ in range((num_hops + 1) * num_chains)]
    while len(set(names)) < num_chains * (num_hops + 1):  # duplicates stay in the list, as RULER keeps them
        names.append(random_name(run, letters))
    chains_names, chains = [], []
    for i in range(0, len(names), num_hops + 1):
        chain_names = names[i : i + num_hops + 1]
        chains_names.append(chain_names)
        value = EXAMPLE_VALUE if is_example else str(run.np_rng.randint(10000, 99999))
        chain = [f"VAR {chain_names[0]} = {value}"]
        chain += [f"VAR {chain_names[j + 1]} = VAR {chain_names[j]} " for j in range(num_hops)]
        chains.append(chain)
    return chains_names, chains


def essay_context(run: VtRun, chains: list[list[str]], num_noises: int) -> str:
    """The essay's sentences with every statement placed at a random depth."""
    sentences = run.sentences(num_noises)
    statements = _heap_shuffle(run, chains)
    depths = run.rng.sample(DEPTHS, len(statements))
    cuts = [0, *sorted(int(len(sentences) * (depth / 100)) for depth in depths), len(sentences)]
    parts = []
    for i in range(1, len(cuts)):
        parts.append(" ".join(sentences[cuts[i - 1] : cuts[i]]))
        if i - 1 < len(statements):
            parts.append(statements[i - 1].strip() + ".")
    return " ".join(parts)


def _heap_shuffle(run: VtRun, chains: list[list[str]]) -> list[str]:
    """The statements of all chains interleaved at random, each chain's kept in order (RULER's heap shuffle)."""
    heap: list[tuple[float, int, int]] = []
    for i in range(len(chains)):
        heapq.heappush(heap, (run.rng.random(), i, 0))
    shuffled = []
    while heap:
        _, i, j = heapq.heappop(heap)
        shuffled.append(chains[i][j])
        if j + 1 < len(chains[i]):
            heapq.heappush(heap, (run.rng.random(), i, j + 1))
    return shuffled


def noise_context(run: VtRun, chains: list[list[str]], num_noises: int) -> str:
    """`num_noises` noise lines with each chain's statements inserted, in order, at random lines."""
    lines = [NOISE] * num_noises
    for chain in chains:
        checked_sample_size(len(chain), len(lines))
        positions = sorted(run.rng.sample(range(len(lines)), len(chain)))
        for j, position in enumerate(positions):
            lines.insert(position + j, chain[j])
    return "\n".join(lines)


def draw_prompt(run: VtRun, num_noises: int, is_example: bool) -> tuple[str, list[str]]:
    """One prompt (task template and answer prefix, filled) with `num_noises` haystack items, and the names of the
    first chain (its answer)."""
    names, chains = draw_chains(run, is_example)
    value = chains[0][0].split("=")[-1].strip()
    if run.args["type_haystack"] == "essay":
        context = essay_context(run, chains, num_noises)
    else:
        context = noise_context(run, chains, num_noises)
    context = context.replace(". \n", ".\n")
    template = run.spec["template"] + run.spec["answer_prefix"]
    return template.format(context=context, query=value, num_v=run.args["num_hops"] + 1), names[0]


def randomized_example(run: VtRun, example: str) -> str:
    """The worked example with its answer's names and its value redrawn (every occurrence replaced)."""
    for name in example.strip().split()[-run.args["num_hops"] - 1 :]:
        example = example.replace(name, random_name(run, len(name)))
    return example.replace(EXAMPLE_VALUE, str(run.np_rng.randint(10000, 99999)))


def generate_run(
    run: VtRun, max_seq_length: int, num_samples: int, example: dict[str, Any] | None, task: str, fix: str
) -> list[dict[str, Any]]:
    """One of RULER's two runs: the worked example's (`example` None: unfinished records, no answer prefix cut)
    or the samples' (each prompt preceded by a randomized copy of `example`)."""
    haystack = run.args["type_haystack"]
    incremental = EXAMPLE_INCREMENTAL[haystack] if example is None else INCREMENTAL[haystack]
    if example is not None and haystack != "essay" and max_seq_length < 4096:
        incremental = SHORT_INCREMENTAL
    budget = run.spec["tokens_to_generate"] if example is not None else 0
    shown = None if example is None else example["input"] + " " + " ".join(example["outputs"]) + "\n"
    shown_tokens = 0 if shown is None else run.count_tokens(shown)
    is_example = example is None

    def prompt_tokens(num_noises: int) -> int:
        return run.count_tokens(draw_prompt(run, num_noises, is_example)[0])

    per_item = estimate(prompt_tokens, incremental, task)
    high = max(int((max_seq_length / per_item) * 3), incremental * 2)
    best = largest_fitting(lambda n: prompt_tokens(n) + shown_tokens + budget, incremental, high, max_seq_length)
    num_noises = incremental if best is None else best

    def attempt(size: int) -> tuple[tuple[str, list[str]], int]:
        text, names = draw_prompt(run, size, is_example)
        if shown is not None:
            cut = text.index(run.spec["template"][:CUTOFF_CHARS])
            text = text[:cut] + randomized_example(run, shown) + "\n" + text[cut:]
        return (text, names), run.count_tokens(text) + budget

    records: list[dict[str, Any]] = []
    for index in range(num_samples):
        (text, names), length = draw_fitting(attempt, num_noises, incremental, max_seq_length, task, fix)
        if example is None:
            records.append({"index": index, "input": text, "outputs": names, "length": length})
        else:
            records.append(ruler_record(index, text, names, length, run.spec["answer_prefix"]))
    return records


def generate(
    spec: dict[str, Any], count_tokens: TokenCounter, max_seq_length: int, num_samples: int, seed: int,
    inputs: RulerInputs,
) -> list[dict[str, Any]]:  # fmt: skip
    """RULER's vt records for one task at one length (`max_seq_length` includes the tokens to generate)."""
    args = spec["args"]
    task = spec.get("task", "vt")
    check_args(spec, task)
    statements = args["num_chains"] * (args["num_hops"] + 1)
    if statements + spec["tokens_to_generate"] > max_seq_length:  # each takes several tokens: hopeless to draw
        raise fail(f"{task} cannot be generated at length {max_seq_length}: args.num_chains × (args.num_hops + 1) "
                   f"asks for {statements:,} statements, and {spec['tokens_to_generate']} tokens are to be generated",
                   "lower num_chains or num_hops in the task file, or use a longer length")  # fmt: skip
    essay = args["type_haystack"] == "essay"
    run = VtRun(spec, count_tokens, Random(seed), np.random.RandomState(seed), essay_words(inputs) if essay else None)
    example = generate_run(run, EXAMPLE_LENGTH, 1, None, f"{task} (its worked example)", EXAMPLE_FIX)[0]
    return generate_run(run, max_seq_length, num_samples, example, task, "use a longer length")


def check_args(spec: dict[str, Any], task: str) -> None:
    """Refuse, in one line, what RULER would loop forever on or stop on with a traceback."""
    args = spec["args"]
    if "{" in spec["template"][:CUTOFF_CHARS]:
        raise fail(f"RULER's {task} finds where to insert its worked example by the template's first "
                   f"{CUTOFF_CHARS} characters, and they hold a placeholder",
                   "start the template with at least 20 characters of plain text")  # fmt: skip
    for letters, hops in ((3, min(10, args["num_hops"])), (5, args["num_hops"])):  # the example's names, then the rest
        if args["num_chains"] * (hops + 1) > 26**letters:  # RULER would draw names forever
            raise fail(f"RULER's {task} has too few {letters}-letter variable names for {args['num_chains']} chains "
                       f"of {args['num_hops']} hops", "use fewer chains or hops")  # fmt: skip
    if args["type_haystack"] == "essay" and args["num_chains"] * (args["num_hops"] + 1) > len(DEPTHS):
        raise fail(f"RULER's {task} places at most {len(DEPTHS)} statements in an essay",
                   "lower num_chains × (num_hops + 1) in the task file")  # fmt: skip
