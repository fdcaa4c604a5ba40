"""README.md and docs/*.md: every relative link resolves (file and anchor), every megaeval command example parses
against the real command line, and the README stays a short front door that links every docs page."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest
import typer

from megaeval.cli import app

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 280

FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
# [text](target) and ![alt](target); link text may hold one level of brackets; an optional "title" after the target
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`]+`")
EXTERNAL = ("http://", "https://", "mailto:")
NOT_SHELL = {"python", "py", "pycon", "yaml", "yml", "json", "jsonl", "toml", "ini", "text", "txt", "diff"}
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "&>"}
PROGRAMS = {"megaeval", ".venv/bin/megaeval"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
NEGATIVE_NUMBER = re.compile(r"^-\d")


def split_markdown(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The prose lines (fenced blocks blanked, so line numbers hold) and the fenced blocks as (language, lines)."""
    prose: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in text.splitlines():
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
            blocks.append((opened.group(2).lower(), []))
            prose.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            else:
                blocks[-1][1].append(line)
            prose.append("")
        else:
            prose.append(line)
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, only letters, digits, spaces, '-' and '_' kept, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every heading anchor of a markdown file, repeats numbered as GitHub numbers them (x, x-1, x-2, ...)."""
    prose, _ = split_markdown(page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose:
        if m := HEADING.match(line):
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def links(page: Path) -> list[str]:
    """The targets of a markdown file's links and images outside code (fenced blocks and `code spans`)."""
    prose, _ = split_markdown(page.read_text(encoding="utf-8"))
    text = INLINE_CODE.sub("", "\n".join(prose))
    return LINK.findall(text)


def link_problems(page: Path) -> list[str]:
    """One line per relative link of `page` whose file is missing or whose #anchor is no heading of that file."""
    problems = []
    for target in links(page):
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = unquote(target).partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            problems.append(f"{page.name}: ({target}): no such file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{page.name}: ({target}): {linked.name} has no heading with anchor #{anchor}")
    return problems


@cache
def cli() -> typer.core.TyperGroup:
    """megaeval's real click group, built from the typer app."""
    return typer.main.get_command(app)


def options(name: str | None) -> set[str] | None:
    """Every option spelling a subcommand (or, for None, the root) declares, with --help; None: no such command."""
    group = cli()
    command = group if name is None else group.commands.get(name)
    if command is None:
        return None
    declared = {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
    return declared | set(command.context_settings.get("help_option_names", ["--help"]))


def megaeval_arguments(tokens: list[str]) -> list[str] | None:
    """The arguments after `megaeval` when the tokens invoke it (`megaeval`, `.venv/bin/megaeval`, `python -m
    megaeval`, `torchrun ... -m megaeval`), cut at the first shell operator; None when they do not."""
    words = [t for t in tokens if t != "$"]
    while words and ENV_ASSIGNMENT.match(words[0]):
        words = words[1:]
    modules = [k + 2 for k in range(len(words) - 1) if words[k] == "-m" and words[k + 1] == "megaeval"]
    if words and words[0] in PROGRAMS:
        rest = words[1:]
    elif modules:
        rest = words[modules[0] :]
    else:
        return None
    for k, word in enumerate(rest):
        if word in SHELL_OPERATORS:
            return rest[:k]
    return rest


def argument_problems(arguments: list[str], where: str) -> list[str]:
    """One line per unknown subcommand or option in `megaeval ARGUMENTS`."""
    name = arguments[0] if arguments and not arguments[0].startswith("-") else None
    known = options(name)
    if known is None:
        return [f"{where}: no command `megaeval {name}`"]
    problems = []
    for word in arguments[1 if name else 0 :]:
        if word == "--":
            break
        if word.startswith("-") and word != "-" and not NEGATIVE_NUMBER.match(word):
            flag = word.split("=", 1)[0]
            if flag not in known:
                problems.append(f"{where}: `megaeval {name or ''}` has no option {flag}")
    return problems


def shell_lines(language: str, lines: list[str]) -> list[str]:
    """A shell block's command lines, backslash continuations joined; a console block's `$ ` lines only."""
    if language in NOT_SHELL:
        return []
    if language == "console":
        lines = [line.strip()[2:] for line in lines if line.strip().startswith("$ ")]
    joined, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            joined.append(pending + line)
            pending = ""
    return joined + ([pending] if pending else [])


def command_examples(text: str) -> list[tuple[str, list[str] | None]]:
    """Every megaeval invocation of a markdown text: (the line, its arguments, or None where the line does not
    split as the shell would)."""
    prose, blocks = split_markdown(text)
    found: list[tuple[str, list[str] | None]] = []
    for language, lines in blocks:
        for line in shell_lines(language, lines):
            if not re.search(r"(^|[\s/])megaeval(\s|$)", line):
                continue
            try:
                arguments = megaeval_arguments(shlex.split(line, comments=True))
            except ValueError:
                found.append((line, None))
                continue
            if arguments is not None:
                found.append((line, arguments))
    for span in INLINE_CODE.findall("\n".join(prose)):  # `megaeval report A.json [--format table|markdown|csv]`
        words = span.strip("`").translate(str.maketrans("[]()", "    ")).split()
        if len(words) > 1 and words[0] == "megaeval" and re.fullmatch(r"[a-z][a-z-]*|--?[a-z][\w-]*", words[1]):
            found.append((span.strip("`"), words[1:]))
    return found


def command_problems(page: Path) -> list[str]:
    """One line per megaeval example of `page` that names an unknown subcommand or option, or does not split."""
    problems = []
    for line, arguments in command_examples(page.read_text(encoding="utf-8")):
        if arguments is None:
            problems.append(f"{page.name}: does not split as the shell would: {line.strip()}")
        else:
            problems += argument_problems(arguments, f"{page.name}: {line.strip()[:100]}")
    return problems


def page_id(page: Path) -> str:
    """A test id: the path from the repository root."""
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves(page: Path) -> None:
    """Each relative link names a file that exists, and its #anchor a heading of that file."""
    problems = link_problems(page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_command_example_parses(page: Path) -> None:
    """Each megaeval example names a real subcommand and only options that subcommand declares."""
    problems = command_problems(page)
    assert not problems, "\n".join(problems)


def test_the_examples_cover_every_command() -> None:
    """Every subcommand has an example somewhere (so the examples are really found), and the README has one each."""

    def named(page: Path) -> set[str]:
        """The subcommands a page has examples of."""
        examples = command_examples(page.read_text(encoding="utf-8"))
        return {arguments[0] for _, arguments in examples if arguments}

    everywhere = set().union(*(named(page) for page in PAGES))
    assert set(cli().commands) <= everywhere
    assert set(cli().commands) <= named(README)


def test_readme_is_a_short_front_door_linking_every_docs_page() -> None:
    """README.md is at most 280 lines and links every docs/*.md page."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    linked = {(README.parent / unquote(t).partition("#")[0]).resolve() for t in links(README)}
    assert [page.name for page in DOCS if page.resolve() not in linked] == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        (
            "Needle in a haystack: passkey and RULER, 4K to 1M tokens",
            "needle-in-a-haystack-passkey-and-ruler-4k-to-1m-tokens",
        ),
        ("BOS: `--bos auto|always|never`", "bos---bos-autoalwaysnever"),
        ("Academic suite: MMLU, BoolQ, … (Table 1)", "academic-suite-mmlu-boolq--table-1"),
        ("`megaeval info`", "megaeval-info"),
        ("snake_case and Ünïcode", "snake_case-and-ünïcode"),
    ],
)
def test_slug_is_githubs(heading: str, anchor: str) -> None:
    """Headings become the anchors GitHub gives them."""
    assert slug(heading) == anchor


BAD_PAGE = """# A page

[fine](#a-page) [fine too](other.md#second-part) [web](https://example.com/#anything)
[missing file](no-such-page.md) [missing anchor](other.md#no-such-part) [missing here](#nowhere)
`[not a link](in-code.md)`

```bash
megaeval ppl-sweep --stream s --out r.json   # fine
megaeval ppl-sweep --stream s --no-such-flag 3 \\
    --out r.json
torchrun --nproc-per-node 2 -m megaeval no-such-command --out r.json
OMP_NUM_THREADS=1 .venv/bin/megaeval scrolls -z
python -m megaeval.harness --model megaeval --no-such-harness-flag
```

```python
megaeval.load_model("--not-a-flag")
```

`megaeval report A.json [--no-such-format html]`
"""


def test_the_checkers_catch_broken_links_and_flags(tmp_path: Path) -> None:
    """A page with a missing file, missing anchors, an unknown option, command and short option fails each way."""
    (tmp_path / "other.md").write_text("# Other\n\n## Second part\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(BAD_PAGE, encoding="utf-8")
    broken = link_problems(page)
    assert len(broken) == 3
    assert [p for p in broken if "no-such-page.md" in p and "no such file" in p]
    assert [p for p in broken if "#no-such-part" in p] and [p for p in broken if "#nowhere" in p]
    bad = command_problems(page)
    assert len(bad) == 4, bad
    assert [p for p in bad if p.endswith("has no option --no-such-flag")]
    assert [p for p in bad if p.endswith("no command `megaeval no-such-command`")]
    assert [p for p in bad if p.endswith("has no option -z")]
    assert [p for p in bad if p.endswith("has no option --no-such-format")]
