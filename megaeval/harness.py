"""megaeval models inside lm-evaluation-harness: the lm-eval model `megaeval` and `python -m megaeval.harness`.

    python -m megaeval.harness --model megaeval --model_args pretrained=CKPT,dtype=float64 --tasks TASK ...

Model args: `pretrained` (a megaeval model spec), `dtype`, `device`, any option of the model's family
(`norm_stats`, `kernels`, `tokenizer`, `max_context`, ...; see `megaeval.load_model`), and

* `bos=auto|always|never`: start every loglikelihood / generation context with BOS (auto: as `megaeval
  academic` does by default), so both give the same numbers;
* `rolling=full|harness`: `loglikelihood_rolling` as one pass over [BOS] + document carrying the state
  (exact at any length; fixed-context models use `window_policy`, default disjoint), or the harness's
  own disjoint windows of `max_length` tokens (default: the model's max_context, else 2048);
* `max_gen_toks` (default 256): generation length when a request does not set it.

`--apply_chat_template [NAME]` renders prompts with the tokenizer's chat template (or the named one of several) through
`megaeval.scoring.chat`, megaeval's one chat renderer, as HFLM renders them; a context that already starts with the
BOS token's text gets no BOS under bos=auto (as HFLM's tok_encode). A tokenizer without a template (any
sentencepiece tokenizer) is refused in one line.

The BOS policy, request scoring and generation truncation are `megaeval.scoring.requests`'s, the ones `megaeval
academic` uses. `loglikelihood` reads every distinct context once and scores each continuation from a clone of its
state (`score_requests`); `generate_until` decodes greedily on the carried state, a fixed-context model keeping
the prompt's last max_context - max_gen_toks tokens. Under torchrun the ranks join a process group and lm-eval
splits the documents across them.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .console import error_line

try:
    from lm_eval.api.model import TemplateLM
except ImportError:
    _NEEDS = "megaeval.harness needs lm-evaluation-harness; pip install 'megaeval[harness]'"
    if __name__ == "__main__":  # python -m megaeval.harness: one line, like every megaeval command
        error_line(_NEEDS)
        raise SystemExit(2) from None
    raise ImportError(_NEEDS) from None
from tqdm import tqdm

from .distributed import DistContext, detect_launch, init_distributed
from .errors import MegaevalError, fail
from .harness_scoring import generate, generate_many, loglikelihoods, rolling_full, rolling_harness  # noqa: F401
from .models import load_model
from .scoring.chat import ChatTemplate, chat_bos, select_template
from .scoring.generate import parse_batch_size, rows_per_batch
from .scoring.requests import bos_policy, bos_prefix
from .scoring.windows import parse_window_policy

log = logging.getLogger(__name__)

ROLLING_MODES = ("full", "harness")
DEFAULT_MAX_LENGTH = 2048  # the harness's own default (HFLM) for a model without a fixed context
DEFAULT_MAX_GEN_TOKS = 256  # the harness's own default

_JOINED: DistContext | None = None  # the process group this process joined under torchrun, if any


def _device(device: str | None) -> str:
    """The device to load on: the harness's default cuda:0 falls back to the CPU when there is no GPU."""
    if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
        if device is not None:
            log.warning("device %s requested but CUDA is not available: using the CPU", device)
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def _join(device: str) -> str:
    """Under torchrun with several ranks, join them (once) and return this rank's device."""
    global _JOINED
    launch = detect_launch()
    if launch is None or launch.world_size == 1 or (dist.is_available() and dist.is_initialized()):
        return device
    _JOINED = init_distributed("cuda" if device.startswith("cuda") else device)  # cuda -> cuda:LOCAL_RANK
    atexit.register(_JOINED.close)
    return str(_JOINED.device)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if str(value) not in allowed:
        raise fail(f"bad model arg {name}={value!r}", f"use one of: {', '.join(allowed)}")
    return str(value)


class MegaevalLM(TemplateLM):
    """Any megaeval model (a StreamingLM) as an lm-evaluation-harness LM; see the module's docstring."""

    def __init__(
        self,
        pretrained: str | None = None,
        dtype: str = "float32",
        device: str | None = None,
        batch_size: int | str | None = 1,
        max_batch_size: int | None = None,
        bos: str | bool = "auto",
        rolling: str = "full",
        window_policy: str = "disjoint",
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        **options: Any,
    ) -> None:
        """Load `pretrained` with `dtype`, `device` and the family's `options`; check the scoring args."""
        super().__init__()
        if pretrained is None:
            raise fail("the megaeval model needs pretrained=SPEC", "pass --model_args pretrained=CHECKPOINT_DIR")
        self.bos = bos_policy(bos, "model arg bos")
        self.rolling = _choice("rolling", rolling, ROLLING_MODES)
        parse_window_policy(window_policy)
        self.window_policy = str(window_policy)
        self.model = load_model(str(pretrained), device=_join(_device(device)), dtype=dtype, **options)
        self._device = self.model.device
        self.bos_tokens = bos_prefix(self.model, self.bos)  # the same rule as `megaeval academic --bos`
        self.batch_size, self.max_batch_size = batch_size, max_batch_size  # generation decodes this many together
        self._max_length = int(max_length or self.model.max_context or DEFAULT_MAX_LENGTH)
        if self.model.max_context is not None and self._max_length > self.model.max_context:
            raise fail(f"max_length {self._max_length} exceeds the model's max_context {self.model.max_context}")
        self.max_gen_toks = int(max_gen_toks)
        self._chat: ChatTemplate | None = None  # the template prompts render with, once lm-eval asks for one

    # ---------------------------------------------------------------------------- what lm-eval asks

    @property
    def eot_token_id(self) -> int:
        """End of text: the tokenizer's EOS."""
        return self.model.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and a rolling document are conditioned on: BOS, else EOS (as HFLM)."""
        bos = self.model.tokenizer.bos_id
        return bos if bos is not None and bos >= 0 else self.eot_token_id

    @property
    def max_length(self) -> int:
        """Window length of rolling=harness and what the harness reports as max_length."""
        return self._max_length

    @property
    def rank(self) -> int:
        """This process's rank (torch.distributed when initialised, else 0)."""
        return dist.get_rank() if _distributed() else 0

    @property
    def world_size(self) -> int:
        """Number of ranks (torch.distributed when initialised, else 1)."""
        return dist.get_world_size() if _distributed() else 1

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor, concatenated along dim 0 (0-dim tensors stacked)."""
        if not _distributed():
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's object on rank `dst` (None elsewhere)."""
        if not _distributed():
            return [obj]
        out = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, out, dst=dst, group=_JOINED.object_group if _JOINED else None)
        return out

    def barrier(self) -> None:
        """Wait for every rank."""
        if _distributed():
            dist.barrier(group=_JOINED.object_group if _JOINED else None)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Plain token ids: BOS is added by the scoring methods, by policy."""
        return self.model.tokenizer.encode(string)

    def tok_decode(self, tokens: list[int], **kwargs: Any) -> str:
        """Text of token ids."""
        return self.model.tokenizer.decode(list(tokens))

    def get_model_info(self) -> dict[str, Any]:
        """Facts for the harness's results: the model and every choice that changes a number."""
        return {
            "megaeval": {
                "model": self.model.describe(), "options": self.model.options(), "bos": self.bos,
                "bos_tokens": self.bos_tokens, "rolling": self.rolling, "window_policy": self.window_policy,
                "max_length": self.max_length, "max_context": self.model.max_context,
                "chat_template": self._chat.facts() if self._chat is not None else None,
            }
        }  # fmt: skip

    # ---------------------------------------------------------------------------- chat (--apply_chat_template)

    @property
    def tokenizer_name(self) -> str:
        """The tokenizer in lm-eval's request-cache keys: its folder's (and file's) name, its content checksum and its
        chat templates' checksum, so a changed tokenizer or template never reads another's cached prompts."""
        facts = self.model.tokenizer.describe()
        path = Path(str(facts.get("path") or "tokenizer"))  # a folder, or a file (tokenizer.model, a GGUF) in one
        name = f"{path.parent.name}__{path.name}" if path.is_file() else path.name
        name += f"-{str(facts.get('sha256'))[:16]}"
        templates = getattr(getattr(self.model.tokenizer, "tok", None), "chat_template", None)
        if templates:
            name += "-chat-" + hashlib.sha256(json.dumps(templates, sort_keys=True).encode()).hexdigest()[:16]
        return name

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """lm-eval's selection: None when off; True the tokenizer's template (or the "default" of several), a name one
        of several (a name for a single template is ignored with a warning, as lm-eval does). Prompts render with it."""
        if chat_template is False or chat_template is None:
            return None
        self._chat = self._select(None if isinstance(chat_template, bool) else str(chat_template))
        return self._chat.text

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The turns as the chat template writes them (`megaeval.scoring.chat`): a generation prompt, or the final
        assistant turn continued; a template that raises on a system turn is tried again without it (as HFLM)."""
        if self._chat is None:
            self._chat = self._select(None)
        dropped = self._chat.system_dropped
        try:
            text = self._chat.render([dict(turn) for turn in chat_history], add_generation_prompt)
        except MegaevalError as e:
            raise MegaevalError(_harness_flag(str(e))) from None
        if self._chat.system_dropped and not dropped:
            log.warning("the chat template %r cannot render a system turn: rendering without it", self._chat.name)
        return text

    def _select(self, name: str | None) -> ChatTemplate:
        templates = getattr(getattr(self.model.tokenizer, "tok", None), "chat_template", None)
        if name and isinstance(templates, str):
            log.warning("chat template %r asked for, but the tokenizer has one template without a name: using it", name)
            name = None
        try:
            return select_template(self.model, name)
        except MegaevalError as e:
            raise MegaevalError(_harness_flag(str(e))) from None

    def _bos(self, context: str) -> list[int]:
        """[BOS] or [] before a context, by the bos policy; under auto a context that already starts with the BOS
        token's text (a chat template that writes it) gets none, as HFLM's tok_encode decides."""
        return [self.model.tokenizer.bos_id] if chat_bos(self.model, self.bos, context) else []

    # ---------------------------------------------------------------------------- requests

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any
                              ) -> list[tuple[float, bool]]:  # fmt: skip
        """Score ((context, continuation), context ids, continuation ids) requests, BOS by policy."""
        pairs = []
        for (context, _), context_ids, continuation_ids in requests:
            prefix = self._bos(context) if context else []  # an empty context already is [prefix_token_id]
            pairs.append((prefix + list(context_ids), list(continuation_ids)))
        size = rows_per_batch(self.model, self._rows(), self.model.max_context or DEFAULT_MAX_LENGTH)
        results = loglikelihoods(self.model, pairs, progress=not disable_tqdm and self.rank == 0, batch_size=size)
        for (strings, _, _), result in zip(requests, results, strict=True):
            if strings[0] is not None:
                self.cache_hook.add_partial("loglikelihood", strings, result)
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole document, conditioned on the prefix token (see `rolling`)."""
        out = []
        for request in tqdm(requests, desc="megaeval rolling", disable=disable_tqdm or self.rank != 0):
            (text,) = request.args
            tokens = self.tok_encode(text)
            if self.rolling == "harness":
                value = rolling_harness(self.model, tokens, self.prefix_token_id, self.max_length)
            else:
                value = rolling_full(self.model, [self.prefix_token_id] + tokens, self.window_policy)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), value)
            out.append(value)
        return out

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Greedy generation on the carried state until a stop string, EOS or max_gen_toks; consecutive requests
        with the same stops and length are decoded together (`batch_size`: the harness's, auto by default)."""
        asked = []
        for request in requests:
            context, gen_kwargs = request.args
            kwargs = dict(gen_kwargs or {})
            if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0) > 0:
                raise fail("megaeval decodes greedily only", "drop do_sample / temperature from the task's gen_kwargs")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            ids = self._bos(context) + self.tok_encode(context) if context else [self.prefix_token_id]
            asked.append((ids, until, int(kwargs.get("max_gen_toks", self.max_gen_toks))))
        size = rows_per_batch(self.model, self._rows(), self.model.max_context or DEFAULT_MAX_LENGTH)
        out: list[str] = []
        bar = tqdm(total=len(asked), desc="megaeval generate", disable=disable_tqdm or self.rank != 0)
        start = 0
        while start < len(asked):
            end = start + 1
            while end < len(asked) and end - start < 64 and asked[end][1:] == asked[start][1:]:
                end += 1
            out += generate_many(self.model, [a[0] for a in asked[start:end]], *asked[start][1:], batch_size=size)
            bar.update(end - start)
            start = end
        bar.close()
        for request, text in zip(requests, out, strict=True):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return out

    def _rows(self) -> str | int:
        """The harness's batch_size as megaeval's: a number, or auto (also for the harness's auto:N)."""
        text = str(self.batch_size if self.batch_size is not None else "auto")
        return "auto" if text.startswith("auto") else parse_batch_size(text)


def _harness_flag(message: str) -> str:
    """A chat-template error of `megaeval.scoring.chat` in the harness's words (its flag is --apply_chat_template)."""
    return message.replace("--chat-template", "--apply_chat_template")


def register() -> type[MegaevalLM]:
    """Register MegaevalLM as lm-eval's model `megaeval` (idempotent); the harness's own models stay known."""
    import lm_eval.models  # noqa: F401  (fills the registry first; lm-eval only does so when it is empty)
    from lm_eval.api.registry import get_model, register_model

    try:
        current = get_model("megaeval")
    except ValueError:
        current = None
    if current is not MegaevalLM:
        register_model("megaeval")(MegaevalLM)
    return MegaevalLM


def main(argv: list[str] | None = None) -> None:
    """`python -m megaeval.harness <lm_eval arguments>`: the harness's own CLI with `megaeval` registered."""
    register()
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        try:
            cli_evaluate()
        except BaseException as e:
            if _JOINED is not None:  # tell the other ranks; raises the message every rank sees
                _JOINED.__exit__(type(e), e, e.__traceback__)
            raise
        finally:
            if _JOINED is not None:
                _JOINED.close()
    except MegaevalError as e:
        error_line(str(e))
        raise SystemExit(2) from None


if __name__ == "__main__":
    from megaeval.harness import main as _main  # the importable module's class, the one registered

    _main()
else:
    register()
