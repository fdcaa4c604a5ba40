"""Black-box helpers for tests/test_hostile_inputs.py and tests/test_kill_resume.py.

megaeval is driven only through its command line, `python -m megaeval ARGV...`, in its own process.
A fresh interpreter spends ~1.3 s importing torch and ~1.9 s more on torch's first meta-device
operation (megaeval builds models on the meta device); paid by each of ~100 cases that is minutes.
So by default the commands run under a small fork server: one helper process
(`python -c SERVER`) imports torch and the other third-party libraries (never megaeval), warms the
meta device once, and forks a child per command. The child sets argv, cwd, stdin (/dev/null),
stdout and stderr (files) and runs the `megaeval` module as `python -m megaeval` would (runpy,
`__main__`), with the interpreter's own handling of SystemExit and uncaught exceptions (a traceback
on stderr, exit code 1). Nothing of megaeval is imported before the fork, and a child is a real
process: SIGKILL kills it like any other.

Set MEGAEVAL_TEST_FRESH_PROCESS=1 to run every command in a brand-new `python -m megaeval` process
instead (slower, same verdicts).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import AUSTEN as AUSTEN  # the tests take it from here
from . import REPO, read_jsonl

SAMPLES = REPO / "data_prep" / "samples"
EMBEDDED_TOKENIZER = REPO / "megaeval" / "assets" / "megalodon-tiny" / "tokenizer.model"
FRESH = os.environ.get("MEGAEVAL_TEST_FRESH_PROCESS", "") not in ("", "0")


def _default_sigint() -> None:
    """In a fresh child: Ctrl-C as in a terminal, however pytest was started (a background job ignores SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SERVER = r"""
import json, os, runpy, signal, sys, time, traceback

# Third-party warm-up only: megaeval itself is imported by each child, after the fork.
import numpy, torch
with torch.device("meta"):
    torch.nn.Embedding(8, 4)
for _name in ("typer", "click", "rich.console", "rich.progress", "rich.table", "sentencepiece", "yaml", "triton",
              "triton.language", "pyarrow.parquet", "pandas", "datasets", "rouge_score.rouge_scorer",
              "typer._adapters", "typer._click.decorators", "pydantic", "pydantic.plugin._loader", "gguf",
              "wonderwords", "torch.distributed", "torch.utils.serialization"):
    try:
        __import__(_name)
    except Exception:
        pass
try:  # transformers loads its model and tokenizer classes lazily: ~4 s a child would pay
    import transformers
    for _attr in ("AutoConfig", "AutoTokenizer", "PreTrainedModel", "PreTrainedTokenizerFast", "LlamaForCausalLM"):
        getattr(transformers, _attr)
except Exception:
    pass
assert not any(m == "megaeval" or m.startswith("megaeval.") for m in sys.modules), "megaeval imported early"

CTL_IN, CTL_OUT = int(sys.argv[1]), int(sys.argv[2])
ctl_in, ctl_out = os.fdopen(CTL_IN, "r"), os.fdopen(CTL_OUT, "w")


def child(req):
    os.close(CTL_IN)
    os.close(CTL_OUT)
    # Ctrl-C as in a terminal, however pytest was started (a background job inherits SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(req["cwd"])
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    for target, path in ((1, req["stdout"]), (2, req["stderr"])):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    os.environ.update(req.get("env") or {})
    sys.argv = ["megaeval", *req["argv"]]
    code = 0
    try:
        runpy.run_module("megaeval", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code & 0xFF)


def reply(obj):
    ctl_out.write(json.dumps(obj) + "\n")
    ctl_out.flush()


finished = {}
for line in ctl_in:
    req = json.loads(line)
    if req["op"] == "spawn":
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                child(req)
            finally:
                os._exit(99)
        reply({"pid": pid})
    elif req["op"] == "poll":  # has the child ended? (its status is kept for "wait")
        if req["pid"] not in finished:
            pid, status = os.waitpid(req["pid"], os.WNOHANG)
            if pid:
                finished[req["pid"]] = status
        reply({"ended": req["pid"] in finished})
    elif req["op"] == "wait":
        deadline = time.monotonic() + req["timeout"]
        timed_out = False
        status = finished.pop(req["pid"], None)
        while status is None:
            pid, status = os.waitpid(req["pid"], os.WNOHANG)
            if pid:
                break
            status = None
            if time.monotonic() > deadline:
                timed_out = True
                os.kill(req["pid"], 9)
                _, status = os.waitpid(req["pid"], 0)
                break
            time.sleep(0.005)
        rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        reply({"rc": rc, "timed_out": timed_out})
"""


@dataclass
class Result:
    """What one `megaeval` process did."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    def describe(self) -> str:
        return (
            f"megaeval {' '.join(self.argv)}\nexit code {self.returncode}\n"
            f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}"
        )


class Process:
    """A started `megaeval` process: its pid, and `wait` for its Result."""

    def __init__(self, runner: Megaeval, argv: list[str], pid: int, out: Path, err: str | Path, popen=None):
        self.runner, self.argv, self.pid, self._out, self._err, self._popen = runner, argv, pid, out, err, popen
        self.result: Result | None = None

    def ended(self) -> bool:
        """True once the process has exited (it may not have been waited for yet)."""
        if self._popen is not None:
            return self._popen.poll() is not None
        return self.result is not None or self.runner._call({"op": "poll", "pid": self.pid})["ended"]

    def kill(self) -> None:
        """SIGKILL the process, unless it has already ended (and been reaped: its pid may be reused)."""
        if self._popen is not None:
            self._popen.kill()
        elif not self.ended():  # not reaped yet, so the pid is still this process's
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float = 300) -> Result:
        if self.result is None:
            if self._popen is not None:
                try:
                    rc, timed_out = self._popen.wait(timeout), False
                except subprocess.TimeoutExpired:
                    self._popen.kill()
                    rc, timed_out = self._popen.wait(), True
            else:
                reply = self.runner._call({"op": "wait", "pid": self.pid, "timeout": timeout})
                rc, timed_out = reply["rc"], reply["timed_out"]
            read = lambda p: Path(p).read_bytes().decode("utf-8", errors="replace")  # noqa: E731
            self.result = Result(self.argv, rc, read(self._out), read(self._err), timed_out)
            for p in (self._out, self._err):
                Path(p).unlink(missing_ok=True)
        return self.result


class Megaeval:
    """Runs `python -m megaeval ARGV` (see the module docstring for the fork server)."""

    def __init__(self, fresh: bool = FRESH):
        self.fresh = fresh
        self.scratch = Path(tempfile.mkdtemp(prefix="megaeval-cli-"))
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(self.scratch / "hf-home"),
                    "HF_MODULES_CACHE": str(self.scratch / "hf-modules"), "COLUMNS": "200"}  # fmt: skip
        self.env.pop("PYTHONWARNINGS", None)
        self._server = None
        self._count = 0

    def _start_server(self) -> None:
        ctl_in_r, ctl_in_w = os.pipe()  # requests: test -> server
        ctl_out_r, ctl_out_w = os.pipe()  # replies: server -> test
        self._server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(ctl_in_r), str(ctl_out_w)], env=self.env, cwd=self.scratch,
            stdin=subprocess.DEVNULL, pass_fds=(ctl_in_r, ctl_out_w),
        )  # fmt: skip
        os.close(ctl_in_r)
        os.close(ctl_out_w)
        self._to_server = os.fdopen(ctl_in_w, "w")
        self._from_server = os.fdopen(ctl_out_r, "r")
        atexit.register(self.close)

    def _call(self, request: dict) -> dict:
        if self._server is None:
            self._start_server()
        self._to_server.write(json.dumps(request) + "\n")
        self._to_server.flush()
        line = self._from_server.readline()
        if not line:
            raise RuntimeError(f"the megaeval fork server died (exit code {self._server.poll()})")
        return json.loads(line)

    def start(self, argv: list[str], cwd: str | Path) -> Process:
        """Start `megaeval ARGV` in `cwd`; returns at once."""
        argv = [str(a) for a in argv]
        self._count += 1
        out = self.scratch / f"{self._count}.out"
        err = self.scratch / f"{self._count}.err"
        if self.fresh:
            with open(out, "wb") as o, open(err, "wb") as e:
                popen = subprocess.Popen([sys.executable, "-m", "megaeval", *argv], cwd=cwd, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=o, stderr=e,
                                         preexec_fn=_default_sigint)  # fmt: skip
            return Process(self, argv, popen.pid, out, err, popen)
        reply = self._call({"op": "spawn", "argv": argv, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)})
        return Process(self, argv, reply["pid"], out, err)

    def run(self, argv: list[str], cwd: str | Path, timeout: float = 300) -> Result:
        """Run `megaeval ARGV` in `cwd` to the end."""
        return self.start(argv, cwd).wait(timeout)

    def close(self) -> None:
        if self._server is not None:
            try:
                self._to_server.close()
                self._server.wait(10)
            except Exception:
                self._server.kill()
            self._server = None
        shutil.rmtree(self.scratch, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------------
# Inputs


def tree_state(*roots: Path) -> dict[str, object]:
    """Every file (sha256 and mode) and folder under `roots`, to compare before and after a command."""
    state: dict[str, object] = {}
    for root in roots:
        if not root.exists():
            continue
        for dirpath, _dirnames, filenames in os.walk(root):
            d = Path(dirpath)
            state[str(d) + "/"] = stat.S_IMODE(d.stat().st_mode)
            for name in filenames:
                p = d / name
                if p.is_symlink():
                    state[str(p)] = ("link", os.readlink(p))
                    continue
                try:
                    digest = hashlib.sha256(p.read_bytes()).hexdigest()
                except OSError as e:
                    digest = f"unreadable: {e.strerror}"
                state[str(p)] = (digest, p.stat().st_size, stat.S_IMODE(p.stat().st_mode))
    return state


def tree_diff(before: dict, after: dict) -> list[str]:
    """Lines naming what appeared, vanished or changed between two `tree_state`s."""
    lines = [f"new: {k}" for k in sorted(set(after) - set(before))]
    lines += [f"gone: {k}" for k in sorted(set(before) - set(after))]
    lines += [f"changed: {k}" for k in sorted(set(before) & set(after)) if before[k] != after[k]]
    return lines


def build_hf_llama(folder: Path, *, max_position_embeddings: int = 64) -> Path:
    """A tiny random transformers Llama with a 300-piece byte-level BPE tokenizer, saved to `folder`."""
    import torch
    import transformers

    from .hf_ranks import save_bpe_tokenizer

    fast = save_bpe_tokenizer(folder, vocab_size=300, chars=20_000)
    config = transformers.LlamaConfig(
        vocab_size=len(fast), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=max_position_embeddings, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def build_hf_bert(folder: Path) -> Path:
    """A tiny random transformers BertForMaskedLM (a masked LM: attends to later tokens) with a BPE tokenizer."""
    import torch
    import transformers

    from .hf_ranks import save_bpe_tokenizer

    fast = save_bpe_tokenizer(folder, vocab_size=300, chars=20_000)
    config = transformers.BertConfig(vocab_size=len(fast), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    transformers.BertForMaskedLM(config).save_pretrained(folder)
    return folder


def malicious_payload(marker: Path, kind: str = "makedirs"):
    """An object whose unpickling runs code that creates `marker`."""

    class Payload:
        def __reduce__(self):
            if kind == "system":
                return (os.system, (f"touch {marker}",))
            if kind == "exec":
                return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))
            return (os.makedirs, (str(marker),))

    return Payload()


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def short_qmsum_rows(split: str, n: int, chars: int = 1500) -> list[dict]:
    """The first `n` SCROLLS QMSum examples of the bundled samples, documents cut to about `chars` characters."""
    rows, seen = [], []
    for row in read_jsonl(SAMPLES / "scrolls" / "qmsum" / f"{split}.jsonl"):
        if row["id"] not in seen:
            if len(seen) == n:
                continue
            seen.append(row["id"])
        question, _, document = row["input"].partition("\n\n")
        rows.append({**row, "input": question + "\n\n" + document[:chars]})
    return rows


@functools.cache
def _commands() -> dict:
    """megaeval's click commands by name (built once: typer builds them anew, about 20 ms, at each call)."""
    import typer

    from megaeval.cli import app

    return typer.main.get_command(app).commands


def overridden(argv: list[str]) -> list[str]:
    """`argv` (a command and its options) with each option of one value given once, at its last value: a case
    appends an option to its base command to replace the base's value, and megaeval refuses one given twice."""
    from megaeval.cli.options import bare_chat_template

    argv = bare_chat_template(argv)
    command = _commands().get(argv[0]) if argv else None
    if command is None:
        return argv
    options = {name: p for p in command.params if p.param_type_name == "option"
               for name in [*p.opts, *p.secondary_opts]}  # fmt: skip
    spans, k = [], 1  # (option, first token, past its value)
    while k < len(argv):
        name, eq, _ = argv[k].partition("=")
        option = options.get(name)
        end = k + (1 if option is None or eq or option.is_flag or option.count else 2)
        if option is not None and not (option.multiple or option.count):
            spans.append((option, k, end))
        k = end
    last = {option: (start, end) for option, start, end in spans}
    dropped = {k for option, start, end in spans if last[option] != (start, end) for k in range(start, end)}
    return [token for k, token in enumerate(argv) if k not in dropped]


def wait_for(predicate, proc: Process, timeout: float = 120, interval: float = 0.002) -> bool:
    """Poll `predicate()` until it holds (True) or the process has ended or time is up (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.ended():
            return predicate()
        time.sleep(interval)
    return False
