"""Commands started in the repository root (issue 23, A7): `python -m`/`-c` and torchrun's ranks put the root on
sys.path, where kernels/, suites/ and data_prep/ are found as top-level packages. transformers probes for Hugging
Face's `kernels` by importing whatever `kernels` find_spec finds, so these folders must stand aside there: an empty
namespace package (read as "not installed"), or the real package of that name further along sys.path.

Every test runs real subprocesses with the repository root as their working directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megaeval_testing import AUSTEN, REPO

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_DATASETS_OFFLINE": "1"}
ENV.pop("PYTHONPATH", None)
TORCHRUN = Path(sys.executable).with_name("torchrun")
FOLDERS = {"kernels": "dispatch", "suites": "academic", "data_prep": "tokenizer"}  # each with a submodule of its own


def in_root(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=env or ENV, timeout=timeout, cwd=REPO)


def megaeval(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m megaeval ARGS` from the repository root."""
    proc = in_root(sys.executable, "-m", "megaeval", *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# --------------------------------------------------------------------------------------- the folders themselves

PROBE = """
import importlib, importlib.util, json, sys
out = {}
for name, part in %r.items():
    found = importlib.util.find_spec(name)  # the folder is still found (the root is sys.path[0] = '')
    module = importlib.import_module(name)  # but importing it gives an empty namespace package
    try:
        importlib.import_module(f"{name}.{part}")
        sub = None
    except ImportError as e:
        sub = type(e).__name__
    out[name] = {"origin": found.origin, "file": module.__file__, "path": list(module.__path__),
                 "names": sorted(n for n in vars(module) if not n.startswith("__")), "submodule": sub}
try:
    from kernels import select  # noqa: F401
    out["from kernels import select"] = None
except ImportError as e:
    out["from kernels import select"] = type(e).__name__
try:
    from transformers.utils import import_utils
    out["transformers"] = [import_utils._is_package_available("kernels", return_version=True),
                           import_utils.is_kernels_available()]
except ImportError:
    pass
import megaeval.data_prep.book_sources, megaeval.kernels, megaeval.suites
from megaeval.tasks.specs import load_spec
out["megaeval"] = [megaeval.kernels.__file__, megaeval.kernels.select.__name__, megaeval.suites.__file__,
                   megaeval.data_prep.book_sources.__file__, bool(load_spec("academic", "arc_easy"))]
print(json.dumps(out))
"""


def test_the_folders_import_as_nothing_at_the_top_and_as_megaeval_packages():
    proc = in_root(sys.executable, "-c", PROBE % (FOLDERS,))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    for name in FOLDERS:
        assert out[name] == {"origin": str(REPO / name / "__init__.py"), "file": None, "path": [], "names": [],
                             "submodule": "ModuleNotFoundError"}, name  # fmt: skip
    assert out["from kernels import select"] == "ImportError"
    if "transformers" in out:
        assert out["transformers"] == [[False, "N/A"], False]
    files = [str(REPO / "kernels" / "__init__.py"), "select", str(REPO / "suites" / "__init__.py"),
             str(REPO / "data_prep" / "book_sources.py"), True]  # fmt: skip
    assert out["megaeval"] == files


def test_a_package_of_the_same_name_elsewhere_on_sys_path_is_the_one_imported(tmp_path):
    """As though the folders were not there: Hugging Face's `kernels` (here a stand-in with a submodule), when
    installed, is what `import kernels` gives in the repository root; megaeval.kernels stays ours."""
    for name in FOLDERS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("from .part import MARK\n")
        (tmp_path / name / "part.py").write_text(f"MARK = 'the other {name}'\n")
    code = f"import {', '.join(FOLDERS)}, megaeval.kernels; print([m.MARK for m in ({', '.join(FOLDERS)})])"
    code += "; print(megaeval.kernels.__file__)"
    proc = in_root(sys.executable, "-c", code, env={**ENV, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [str([f"the other {n}" for n in FOLDERS]), str(REPO / "kernels/__init__.py")]


# -------------------------------------------------------------------------------------- the commands (hf models)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A tiny random Llama, two short books and their stream, made here (not in the repository root)."""
    pytest.importorskip("transformers")
    from megaeval.commands.prep_books import prep_books
    from megaeval_testing.hostile import build_hf_llama

    root = tmp_path_factory.mktemp("repo_root")
    llama = build_hf_llama(root / "llama")
    books = root / "books"
    books.mkdir()
    for name in ("emma", "persuasion"):
        (books / f"{name}.txt").write_text((AUSTEN / f"{name}.txt").read_text(encoding="utf-8")[:6000])
    prep_books([str(books)], str(root / "stream"), model=f"hf:{llama}", workers=1, progress=False)
    return llama, books, root / "stream"


@pytest.mark.slow  # -m slow: test_info_on_an_hf_model runs the same checkout-root setup in the default run
def test_prep_books_with_an_hf_model(hf_run, tmp_path):
    llama, books, stream = hf_run
    megaeval("prep-books", str(books), "--model", f"hf:{llama}", "--out", str(tmp_path / "stream"), "--workers", "1")
    assert (tmp_path / "stream" / "tokens.bin").read_bytes() == (stream / "tokens.bin").read_bytes()


def test_info_on_an_hf_model(hf_run):
    llama, _, _ = hf_run
    out = megaeval("info", f"hf:{llama}").stdout
    for fact in ("LlamaForCausalLM", "11,952", "1 × 16", "300 (bos 1, eos 2)"):
        assert fact in out, out


@pytest.mark.slow  # long (two ranks, whole commands): run with -m slow
def test_ppl_sweep_under_torchrun_equals_one_process(hf_run, tmp_path):
    """`torchrun --standalone --nproc-per-node 2 -m megaeval ppl-sweep` (gloo, 1 thread a rank) in the repository
    root: the report's numbers equal a sweep run here in one process."""
    from megaeval.commands.ppl_sweep import SweepSettings, run_ppl_sweep

    llama, _, stream = hf_run
    flags = {"lengths": "32,64", "tokens": "256", "batch_size": 2, "dtype": "float64"}
    launcher = [str(TORCHRUN)] if TORCHRUN.exists() else [sys.executable, "-m", "torch.distributed.run"]
    proc = in_root(*launcher, "--standalone", "--nproc-per-node", "2", "-m", "megaeval", "ppl-sweep",
                   "--model", f"hf:{llama}", "--stream", str(stream), "--out", str(tmp_path / "two.json"),
                   *(f"--{k.replace('_', '-')}={v}" for k, v in flags.items()), "--no-progress")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "two.json").read_text())
    reference = run_ppl_sweep(
        SweepSettings(model=f"hf:{llama}", stream=str(stream), out=str(tmp_path / "one.json"), **flags), progress=False
    )
    assert report["environment"]["world_size"] == 2
    for a, b in zip(reference["results"]["lengths"], report["results"]["lengths"], strict=True):
        assert (b["context_length"], b["tokens"], b["nll_sum"]) == (a["context_length"], a["tokens"], a["nll_sum"])


@pytest.mark.integration
def test_the_harness_cli_with_the_megaeval_model(hf_run, tmp_path):
    """lm-eval 0.4's own CLI with the `megaeval` model (`python -m megaeval.harness`: 0.4 finds no model plugins)
    on a local multiple-choice task, in the repository root: the logged log-likelihoods are megaeval's."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install -e '.[harness]')")
    from megaeval import load_model
    from megaeval.scoring.requests import bos_prefix, encode_pair, score_requests

    llama, _, _ = hf_run
    paras = [p.strip() for p in (AUSTEN / "emma.txt").read_text(encoding="utf-8").split("\n\n") if len(p) > 200]
    rows = [{"question": paras[i][:80], "choices": [paras[(i + k) % 6][80:100] for k in range(3)], "answer": i % 3}
            for i in range(4)]  # fmt: skip
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "mc.yaml").write_text(
        f"task: megaeval_root_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path}/mc.jsonl\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "Question: {{question}}\\nAnswer:"\n'
        "doc_to_choice: choices\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n"
    )
    proc = in_root(sys.executable, "-m", "megaeval.harness", "--model", "megaeval", "--model_args",
                   f"pretrained=hf:{llama},dtype=float64", "--device", "cpu", "--tasks", "megaeval_root_mc",
                   "--include_path", str(tmp_path), "--log_samples", "--output_path", str(tmp_path / "out"),
                   env={**ENV, "HF_HOME": str(tmp_path / "hf")})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (samples,) = (tmp_path / "out").rglob("samples_megaeval_root_mc_*.jsonl")
    lm = load_model(f"hf:{llama}", dtype="float64")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        pairs = [encode_pair(lm, a["arg_0"], a["arg_1"]) for a in row["arguments"].values()]
        expected = score_requests(lm, bos_prefix(lm, "auto") + pairs[0][0], [p[1] for p in pairs])
        got = [float(r[0][0]) for r in row["resps"]]
        assert max(abs(g - e) for g, e in zip(got, expected.loglikelihoods, strict=True)) <= 1e-6
