"""Property-based hostile inputs: random structural damage to a books-stream manifest, a resume journal, a report,
a data file, a needle task file, a checkpoint's config (every model family) or a GGUF file's header gives either the
very same numbers or one clean error, never a crash and never a silent change.

Each property draws a place in a real input (any key or element, however deep) and damages it: a value of
another JSON type, a deletion, or (journals) a line dropped, doubled or cut; (configs) any number set to 0, -1, a
string or null; (GGUF) any count, length, dimension or offset inflated to 2**31 and beyond, or the file cut anywhere.
The run then must either raise a MegaevalError whose message is one line (what the CLI prints as `error: ...`, exit
2), or succeed with numbers equal to those of the undamaged input (a needle task file: prompts that still fit and
hold their answers); configs and GGUF files within a few seconds and bounded memory too. Anything else (another
exception, different numbers) fails. The default run draws a few cases of each (derandomized: the same every run);
`-m slow` adds every config number of every family, every GGUF count and length, and more cuts.
"""

from __future__ import annotations

import copy
import json
import re
import resource
import shutil
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megaeval.commands.academic import AcademicSettings, run_academic
from megaeval.commands.ppl_sweep import SweepSettings, run_ppl_sweep
from megaeval.commands.report.kinds import compare
from megaeval.commands.scrolls import ScrollsSettings, run_scrolls
from megaeval.models.megalodon import save_checkpoint
from megaeval.streams import BooksStream
from megaeval.streams.writer import prepare_books
from megaeval.tasks.needle.prompts import build_prompts, draw_needles, haystack_words, sample_rng
from megaeval.tasks.needle.spec import check_needle_spec, load_needle_task
from megaeval.tokenizers import SentencePieceTokenizer
from megaeval_testing import AUSTEN, random_model, read_jsonl, small_args
from megaeval_testing.hostile import SAMPLES, short_qmsum_rows, write_jsonl
from megaeval_testing.mutation import DELETE, EXAMPLES, check, damaged, damaged_at, draw_damage, outcome, places

# ------------------------------------------------------------------------------------------------------------------
# Shared inputs: a books stream, a small random MEGALODON, the reports and journal of a sweep of it


@pytest.fixture(scope="module")
def world(tmp_path_factory, sp_model):
    root = tmp_path_factory.mktemp("mutations")
    books = root / "books"
    books.mkdir()
    for name in ("emma", "persuasion", "mansfieldpark"):
        (books / f"{name}.txt").write_text((AUSTEN / f"{name}.txt").read_text(encoding="utf-8")[:2500])
    stream = root / "stream"
    prepare_books([str(books)], stream, {"tokenizer": str(sp_model)}, workers=1, progress=False)
    ckpt = save_checkpoint(random_model(small_args(), 0, torch.float32), root / "ckpt", sp_model)
    return {"root": root, "stream": stream, "ckpt": ckpt, "tokenizer": SentencePieceTokenizer(sp_model)}


def stream_numbers(path: Path, tokenizer) -> Any:
    """What a sweep takes from a stream: its tokens and the bytes and words of spans over them."""
    stream = BooksStream(path)
    stream.check_tokenizer(tokenizer)
    n = len(stream)
    spans = [stream.text_span(a, b, tokenizer) for a, b in ((1, n), (1, n // 2), (n // 3, n))]
    return stream.tokens.tolist(), [(s.bytes, s.words) for s in spans]


def test_damaged_manifests(world):
    manifest_path = world["stream"] / "manifest.json"
    original = json.loads(manifest_path.read_text())
    expected = stream_numbers(world["stream"], world["tokenizer"])

    @EXAMPLES
    @given(st.data())
    def prop(data):
        manifest_path.write_text(json.dumps(draw_damage(data, original)))
        try:
            check(lambda: stream_numbers(world["stream"], world["tokenizer"]), expected)
        finally:
            manifest_path.write_text(json.dumps(original))

    prop()


def sweep(world, out: Path, **kwargs) -> dict:
    options = {"model": str(world["ckpt"]), "stream": str(world["stream"]), "lengths": "16,32", "tokens": "1024",
               "batch_size": 1, "out": str(out), **kwargs}  # fmt: skip
    return run_ppl_sweep(SweepSettings(**options), progress=False)


def sweep_numbers(report: dict) -> list:
    return [(r["context_length"], r["nll_sum"], r["ppl"], r["bits_per_byte"]) for r in report["results"]["lengths"]]


def test_damaged_journals(world):
    root = world["root"]
    expected = sweep_numbers(sweep(world, root / "full.json"))

    def stop_after_three(done: int) -> None:
        if done >= 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_ppl_sweep(SweepSettings(model=str(world["ckpt"]), stream=str(world["stream"]), lengths="16,32",
                                    tokens="1024", batch_size=1, out=str(root / "cut.json")),
                      progress=False, on_unit=stop_after_three)  # fmt: skip
    lines = (root / "cut.json.partial.jsonl").read_text().splitlines()
    assert len(lines) == 4  # the fingerprint and three units
    count = iter(range(10**6))

    @EXAMPLES
    @given(st.data())
    def prop(data):
        damage = data.draw(st.sampled_from(["value", "drop", "double", "cut"]), label="damage")
        n = data.draw(st.integers(0, len(lines) - 1), label="line")
        new = list(lines)
        if damage == "value":
            new[n] = json.dumps(draw_damage(data, json.loads(lines[n])))
        elif damage == "drop":
            del new[n]
        elif damage == "double":
            new.insert(n, lines[n])
        else:
            new[n] = lines[n][: len(lines[n]) // 2]
        out = root / f"resume-{next(count)}.json"
        (root / (out.name + ".partial.jsonl")).write_text("".join(line + "\n" for line in new))
        check(lambda: sweep_numbers(sweep(world, out, resume=True)), expected)

    prop()


def table(path: Path) -> str:
    """A report's rows as `megaeval report` prints them (csv, without the header of model labels)."""
    return compare([path], fmt="csv").split("\n", 1)[1]


@pytest.mark.parametrize("kind", ["ppl-sweep", "academic"])
def test_damaged_reports(world, kind):
    root = world["root"] / f"reports-{kind}"
    root.mkdir()
    if kind == "ppl-sweep":
        sweep(world, root / "report.json")
    else:
        academic(world, root / "data", root / "report.json")
    report = json.loads((root / "report.json").read_text())
    expected = table(root / "report.json")

    @EXAMPLES
    @given(st.data())
    def prop(data):
        path = root / "damaged.json"
        path.write_text(json.dumps(draw_damage(data, report)))
        check(lambda: table(path), expected)

    prop()


# ------------------------------------------------------------------------------------------------------------------
# Data rows: SCROLLS (scoring given predictions) and academic (a random model)


def test_damaged_scrolls_rows(world):
    root = world["root"] / "scrolls"
    rows = short_qmsum_rows("validation", 2)
    write_jsonl(root / "data" / "qmsum" / "train.jsonl", short_qmsum_rows("train", 2))
    ids = list(dict.fromkeys(r["id"] for r in rows))
    preds = write_jsonl(root / "preds.jsonl", [{"task": "qmsum", "id": i, "prediction": "the remote"} for i in ids])

    def score() -> dict:
        options = {"tasks": "qmsum", "data_dir": str(root / "data"), "predictions": str(preds),
                   "out": str(root / "report.json")}  # fmt: skip
        return run_scrolls(ScrollsSettings(**options), progress=False)["results"]

    write_jsonl(root / "data" / "qmsum" / "validation.jsonl", rows)
    expected = score()

    @EXAMPLES
    @given(st.data())
    def prop(data):
        write_jsonl(root / "data" / "qmsum" / "validation.jsonl", draw_damage(data, rows))
        check(score, expected)

    prop()


ACADEMIC = [("arc_easy", "test"), ("boolq", "validation"), ("piqa", "validation")]


def academic(world, data_dir: Path, out: Path, tasks: str = "arc_easy,boolq,piqa") -> dict:
    if not data_dir.exists():
        for task, split in ACADEMIC:
            write_jsonl(data_dir / task / f"{split}.jsonl", read_jsonl(SAMPLES / task / f"{split}.jsonl")[:2])
    options = {"model": str(world["ckpt"]), "tasks": tasks, "data_dir": str(data_dir), "out": str(out)}
    return run_academic(AcademicSettings(**options), progress=False)


@pytest.mark.parametrize(("task", "split"), ACADEMIC)
def test_damaged_academic_rows(world, task, split):
    root = world["root"] / f"academic-{task}"
    data_dir = root / "data"
    path = data_dir / task / f"{split}.jsonl"
    results = lambda: academic(world, data_dir, root / "report.json", task)["results"][task]  # noqa: E731
    expected = results()
    rows = read_jsonl(path)

    @EXAMPLES
    @given(st.data())
    def prop(data):
        write_jsonl(path, draw_damage(data, rows))
        try:
            check(results, expected)
        finally:
            write_jsonl(path, rows)

    prop()
    shutil.rmtree(root)


# ------------------------------------------------------------------------------------------------------------------
# Needle task files: every field deleted, retyped or emptied, and every placeholder removed. A task file that is
# not refused in one line must give prompts that fit the length and hold the needle and every answer (a changed
# field may change the prompts, but never into unanswerable ones).

TASK_JUNK = [DELETE, None, True, -1, 0, 7, 2**40, 1.5, "", "x", [], [1], {"a": 1}]


def task_file_damage(spec: dict) -> list[tuple[str, Any]]:
    """(field, value) for every field and junk value, and every text field with each of its placeholders removed."""
    cases = [(field, junk) for field in spec for junk in TASK_JUNK if field != "task"]
    for field, text in spec.items():
        if isinstance(text, str):
            cases += [(field, text.replace("{" + name + "}", "")) for name in re.findall(r"\{(\w+)\}", text)]
    return cases


def needle_prompts_of(spec: dict) -> list:
    check_needle_spec(spec, f"{spec['task']}.yaml")
    encode = lambda text, prefix: (np.frombuffer((text + prefix).encode(), np.uint8).astype(np.int32),  # noqa: E731
                                   text + prefix, 0)  # fmt: skip
    needles = draw_needles(spec, sample_rng(0, spec["task"], 3000, 0))
    words = haystack_words(spec, None)
    return build_prompts(spec, needles, 3000, [0, 40, 100], spec["max_new_tokens"] % 1000, encode, words)


@pytest.mark.parametrize("task", ["passkey", "niah_multikey_2", pytest.param("niah_single_1", marks=pytest.mark.slow),
                                  pytest.param("niah_multikey_3", marks=pytest.mark.slow),
                                  pytest.param("niah_multivalue", marks=pytest.mark.slow)])  # fmt: skip
def test_damaged_needle_task_files(task):
    spec = load_needle_task(task)
    for field, junk in task_file_damage(spec):
        bad = copy.deepcopy(spec)
        if junk is DELETE:
            del bad[field]
        else:
            bad[field] = junk
        started = time.perf_counter()
        kind, prompts = outcome(lambda: needle_prompts_of(bad))  # noqa: B023
        assert time.perf_counter() - started < 5, (field, junk)
        if kind == "ok":
            for p in prompts:  # fits, holds every answer, and the first needle (with its answer) where it says
                assert len(p.ids) <= 3000 and all(a in p.text for a in p.answers), (field, junk)
                assert p.answers[0] in p.text[p.needle_char : p.needle_char + 300], (field, junk)
            assert [p.needle_char for p in prompts] == sorted(p.needle_char for p in prompts), (field, junk)


# ------------------------------------------------------------------------------------------------------------------
# Checkpoint configs: every number in every family's config files, however deep (model.chunk_size, ssm_cfg.headdim,
# rope_parameters.rope_theta, time_step_limit[1]), set to 0, -1, a string or null. The load must be refused in one
# line naming the file or the field, or give exactly what the clean checkpoint gives: a fixed sequence's per-token
# NLL bit for bit, the tokenizer's facts and the context limit (a field that is read must never change the numbers
# unrefused; one that is unused cannot). Each case runs within a few seconds and bounded memory.
#
# Memory, honestly bounded: tracemalloc sees Python's allocations (JSON, tokenizers, numpy buffers) but not torch's,
# so each case is bounded twice: by tracemalloc's peak, and by the growth of the process's resident high-water mark
# (ru_maxrss records only new peaks, so its growth over a case bounds how far the case went above every earlier
# peak: a tensor sized from a damaged field shows there). An accepted load must also hold exactly the clean
# model's parameters and state.

CONFIG_JUNK = [0, -1, "x", None]
CONFIG_FILES = ("config.json", "consolidate_config.json", "generation_config.json")  # those present
CONFIG_SECONDS, CONFIG_PEAK, RSS_GROWTH = 5, 200 << 20, 256 << 20
EMBEDDED = {"megalodon": "megalodon-tiny", "rfa": "rfa-tiny", "hf": "transformer-tiny", "mamba2": "mamba2-tiny"}
RECURRENT = ["mamba", "falcon_mamba", "rwkv", "recurrent_gemma"]  # tiny ones transformers writes
FAMILIES = [*EMBEDDED, "mamba_ssm", "mamba2_ssm", *RECURRENT]
SCORED = torch.randint(3, 250, (1, 17), generator=torch.Generator().manual_seed(0))  # in every vocabulary


def ssm_layout(src: Path, out: Path, ssm_cfg: dict) -> Path:
    """A transformers Mamba or Mamba-2 folder in the original state-spaces layout: config.json with `ssm_cfg`,
    pytorch_model.bin with `backbone.embedding`, no tokenizer (it loads with tokenizer=src)."""
    from safetensors.torch import load_file

    cfg = json.loads((src / "config.json").read_text())
    weights = load_file(src / "model.safetensors")
    weights["backbone.embedding.weight"] = weights.pop("backbone.embeddings.weight")
    out.mkdir()
    torch.save(weights, out / "pytorch_model.bin")
    (out / "config.json").write_text(json.dumps({
        "d_model": cfg["hidden_size"], "n_layer": cfg["num_hidden_layers"], "vocab_size": cfg["vocab_size"],
        "ssm_cfg": {"d_state": cfg["state_size"], "d_conv": cfg["conv_kernel"], "expand": cfg["expand"], **ssm_cfg},
        "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 4,
        "tie_embeddings": cfg["tie_word_embeddings"], "norm_epsilon": cfg["layer_norm_epsilon"],
    }))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """family -> (a checkpoint folder of its own, its config files to be damaged in place; the load options),
    built on first use: the embedded tiny models copied, the recurrent ones written by transformers."""
    root, built = tmp_path_factory.mktemp("configs"), {}

    def get(family: str) -> tuple[Path, dict]:
        if family not in built:
            from megaeval.models import ASSETS

            if family not in ("megalodon", "rfa"):
                pytest.importorskip("transformers")
            if family in EMBEDDED:
                built[family] = shutil.copytree(ASSETS / EMBEDDED[family], root / family), {}
            elif family in RECURRENT:
                from megaeval_testing.recurrent import save_tiny

                built[family] = save_tiny(root / family, family), {}
            elif family == "mamba_ssm":
                src = get("mamba")[0]
                built[family] = ssm_layout(src, root / family, {"dt_rank": 2}), {"tokenizer": str(src)}
            else:  # mamba2_ssm: the embedded Mamba-2
                src = get("mamba2")[0]
                ssm_cfg = {"layer": "Mamba2", "headdim": 32, "ngroups": 1, "chunk_size": 64}
                built[family] = ssm_layout(src, root / family, ssm_cfg), {"tokenizer": str(src)}
        return built[family]

    return get


def numeric_places(value: Any) -> list[tuple]:
    """The key path of every number in a JSON value (booleans aside), however deep."""
    return [p for p in places(value) if type(damaged_at(value, p)) in (int, float)]


def config_places(folder: Path) -> list[tuple[str, tuple]]:
    """(file, key path) of every number in the folder's config files."""
    return [(name, place) for name in CONFIG_FILES if (folder / name).exists()
            for place in numeric_places(json.loads((folder / name).read_text()))]  # fmt: skip


def load_numbers(folder: Path, options: dict) -> tuple:
    """What a run takes from a checkpoint: a fixed sequence's per-token NLL; the tokenizer's facts and the context
    limit; the parameter count and the state's bytes."""
    from megaeval import load_model

    lm = load_model(folder, dtype="float32", **options)
    nll, _ = lm.score(SCORED[:, :-1], SCORED[:, 1:], lm.init_state(1))
    tok = lm.tokenizer
    facts = tok.vocab_size, tok.bos_id, tok.eos_id, tok.encode("Emma Woodhouse, handsome"), lm.max_context
    return nll, facts, (sum(p.numel() for p in lm.model.parameters()), lm.state_bytes(1))


def max_rss() -> int:
    """The process's resident high-water mark in bytes (ru_maxrss counts KiB on Linux, bytes on macOS)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def bounded(run, seconds: float, peak: int, rss: int = RSS_GROWTH) -> tuple[str, Any]:
    """`outcome(run)`, asserted to take under `seconds`, under `peak` bytes of Python allocations and under `rss`
    bytes above the process's earlier resident high-water mark."""
    high = max_rss()
    tracemalloc.start()
    started = time.perf_counter()
    try:
        result = outcome(run)
    finally:
        took, traced = time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    grown = max_rss() - high
    assert took < seconds and traced < peak and grown < rss, f"{took:.1f} s, {traced:,} B traced, RSS +{grown:,} B"
    return result


def check_config_case(folder: Path, options: dict, clean: tuple, name: str, place: tuple, junk: Any) -> None:
    path = folder / name
    text = path.read_text()
    path.write_text(json.dumps(damaged(json.loads(text), place, junk)))
    case = f"{name}: {'.'.join(map(str, place))} = {junk!r}"
    try:
        kind, got = bounded(lambda: load_numbers(folder, options), CONFIG_SECONDS, CONFIG_PEAK)
    except Exception as e:  # too slow, too big, a message of many lines, or a crash: named with its case
        raise AssertionError(f"{case}: {type(e).__name__}: {e}") from e
    finally:
        path.write_text(text)
    if kind == "error":  # one line (outcome checks), naming the file or the field
        key = next(k for k in reversed(place) if isinstance(k, str))
        assert name in got or key in got, (case, got)
    else:
        assert torch.equal(got[0], clean[0]), f"{case} was accepted and changed the NLL"
        assert got[1:] == clean[1:], f"{case} was accepted and changed the tokenizer, context or sizes"


@pytest.mark.parametrize("family", FAMILIES)
def test_damaged_checkpoint_configs(checkpoint, family):
    """A few cases a family, drawn the same way every run; every case is in the slow test below."""
    folder, options = checkpoint(family)
    clean = load_numbers(folder, options)

    @settings(EXAMPLES, max_examples=8)
    @given(st.sampled_from(config_places(folder)), st.sampled_from(CONFIG_JUNK))
    def prop(where, junk):
        check_config_case(folder, options, clean, *where, junk)

    prop()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_numeric_config_field_of_every_family(checkpoint, family):
    folder, options = checkpoint(family)
    clean = load_numbers(folder, options)
    cases = config_places(folder)
    assert len(cases) >= 5, cases
    for name, place in cases:
        for junk in CONFIG_JUNK:
            check_config_case(folder, options, clean, name, place, junk)


# ------------------------------------------------------------------------------------------------------------------
# GGUF headers: any count or length of a small model file (tensor_count, kv_count, a key's, a string's or a string
# item's length, an array's item count, a tensor's name length, n_dims, dimensions and data offset) inflated to
# 2**31 ... 2**64-1, or the file cut at any byte. Loading it must be refused in one line naming the file, or give the
# clean model's numbers and tokens, within 2 s and 50 MB of Python allocations (the fixed cases of each field, with
# their messages, are in tests/test_gguf_reading.py; these are drawn).

INFLATED = {8: [2**31, 2**40, 2**63 - 1, 2**64 - 1], 4: [2**31, 2**32 - 1]}  # by the field's width in bytes
GGUF_SECONDS, GGUF_PEAK = 2, 50 << 20


def gguf_fields(path: Path) -> list[tuple[str, str, int, int]]:
    """(kind, what, offset, width) of every count and length in a GGUF file, located by gguf's own reader."""
    from gguf.constants import GGUFValueType
    from gguf.gguf_reader import GGUFReader

    def starts(field) -> list[int]:
        return [field.offset + n for n in np.cumsum([0] + [p.nbytes for p in field.parts])[:-1].tolist()]

    reader = GGUFReader(path)
    found = [("tensor_count", "tensor_count", 8, 8), ("kv_count", "kv_count", 16, 8)]
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # the header's version and counts
            continue
        at = starts(field)
        found.append(("key length", f"the key length of {key}", at[0], 8))
        if field.types[0] == GGUFValueType.STRING:
            found.append(("string length", f"the length of {key}", at[3], 8))
        elif field.types[0] == GGUFValueType.ARRAY:
            found.append(("item count", f"the item count of {key}", at[4], 8))
            if field.types[1] == GGUFValueType.STRING:  # parts: each item's length, then its bytes
                found += [("item length", f"the length of {key}[{i}]", a, 8) for i, a in enumerate(at[5::2])]
    for tensor in reader.tensors:
        at, name = starts(tensor.field), tensor.name
        found += [("name length", f"the name length of {name}", at[0], 8), ("n_dims", f"n_dims of {name}", at[2], 4),
                  *(("dimension", f"dimension {d} of {name}", at[3] + 8 * d, 8)
                    for d in range(len(tensor.field.parts[3]))),
                  ("data offset", f"the data offset of {name}", at[5], 8)]  # fmt: skip
    return found


def gguf_numbers(path: Path) -> tuple:
    """A GGUF model's per-token NLL of a fixed sequence, its tokens for a text and a digest of every weight."""
    from megaeval import load_model

    lm = load_model(f"hf:{path}", dtype="float32")
    nll, _ = lm.score(SCORED[:, :-1], SCORED[:, 1:], lm.init_state(1))
    weights = {k: (tuple(v.shape), v.numpy().tobytes()) for k, v in lm.model.state_dict().items()}
    return nll.tolist(), lm.tokenizer.encode("the cat in the hat"), weights


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    """A small GGUF model file: its bytes, the places of its counts and lengths, and its clean numbers."""
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    from megaeval_testing.gguf_files import write_tiny_llama

    path = write_tiny_llama(tmp_path_factory.mktemp("gguf") / "model.gguf")
    fields = gguf_fields(path)
    assert len(fields) > 300 and {w for *_, w in fields} == {4, 8} and len({f[0] for f in fields}) == 10
    return {"bytes": path.read_bytes(), "fields": fields, "clean": gguf_numbers(path), "dir": path.parent}


def check_gguf_case(model: dict, data: bytes, case: str) -> None:
    path = model["dir"] / "damaged.gguf"
    path.write_bytes(data)
    try:
        kind, got = bounded(lambda: gguf_numbers(path), GGUF_SECONDS, GGUF_PEAK)
    except Exception as e:
        raise AssertionError(f"{case}: {type(e).__name__}: {e}") from e
    if kind == "error":
        assert str(path) in got, (case, got)
    else:
        assert got == model["clean"], f"{case} was loaded, with other numbers"


def gguf_damage(model: dict) -> st.SearchStrategy:
    """(what was done, the damaged bytes): a count or length inflated (its kind drawn first, so that the 263 token
    lengths do not crowd out the one tensor_count), or the file cut."""
    data = model["bytes"]
    kinds: dict[str, list] = {}
    for kind, *field in model["fields"]:
        kinds.setdefault(kind, []).append(field)
    fields = st.sampled_from(sorted(kinds)).flatmap(lambda kind: st.sampled_from(kinds[kind]))
    inflate = fields.flatmap(lambda f: st.sampled_from(INFLATED[f[2]]).map(lambda value: inflated(data, *f, value)))
    cut = st.integers(0, len(data) - 1).map(lambda n: (f"cut at byte {n} of {len(data)}", data[:n]))
    return st.one_of(inflate, cut)


def inflated(data: bytes, what: str, offset: int, width: int, value: int) -> tuple[str, bytes]:
    """(what was done, `data` with the `width`-byte little-endian field at `offset` set to `value`)."""
    out = bytearray(data)
    out[offset : offset + width] = value.to_bytes(width, "little")
    return f"{what} (byte {offset}) set to {value}", bytes(out)


def test_damaged_gguf_headers(gguf_model):
    @settings(EXAMPLES, max_examples=30)
    @given(st.data())
    def prop(data):
        case, damaged_bytes = data.draw(gguf_damage(gguf_model), label="damage")
        check_gguf_case(gguf_model, damaged_bytes, case)

    prop()


@pytest.mark.slow
def test_every_inflated_gguf_field_and_many_cuts(gguf_model):
    data = gguf_model["bytes"]
    for _, what, offset, width in gguf_model["fields"]:
        for value in INFLATED[width]:
            case, damaged_bytes = inflated(data, what, offset, width, value)
            check_gguf_case(gguf_model, damaged_bytes, case)

    @settings(EXAMPLES, max_examples=300)
    @given(st.data())
    def prop(data):
        case, damaged_bytes = data.draw(gguf_damage(gguf_model), label="damage")
        check_gguf_case(gguf_model, damaged_bytes, case)

    prop()
