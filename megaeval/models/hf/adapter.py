"""Hugging Face causal LMs (a local directory, or a GGUF file) behind the StreamingLM contract, and their tokenizers
behind megaeval's Tokenizer protocol.

The state is the KV cache. `max_context` comes from the model config (max_position_embeddings,
n_positions, ...) unless `max_context=N` overrides it; feeding more tokens than that into one
state is an error. Needs the `hf` extra: `pip install 'megaeval[hf]'`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ...errors import fail
from ...files import human_bytes
from ...kernels.nll import IGNORE_INDEX
from ..base import StreamingLM
from ..options import as_bool
from . import checkpoint, flops
from .config import check_weights, locate, max_context_of, refuse_remote_code
from .gguf_reading import fast_reading
from .kv_cache import cache_argument, growing_cache
from .model import HFState, refuse_non_causal
from .prefill import STEP_TOKENS, Prefill, activation_bytes, pieces
from .prefill import parse as parse_prefill


class HFTokenizer:
    """A transformers tokenizer seen through megaeval's Tokenizer protocol (no special tokens added)."""

    def __init__(self, tok: Any, source: str):
        self.tok = tok
        self.tok.model_max_length = 1 << 62  # megaeval handles lengths; silence "sequence too long"
        self.source = source
        self.vocab_size = len(tok)
        self.bos_id = tok.bos_token_id
        self.eos_id = tok.eos_token_id
        self._sha256: str | None = None
        self.adds_bos = adds_bos_by_default(tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS/EOS."""
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def encode_offsets(self, text: str, specials: bool = False) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` (`specials`: with the tokenizer's default special tokens) and each token's character
        span: the fast tokenizer's offset mapping, or for a slow one LongPPL's `compute_offsets` (each token's
        length is what it adds to the decoded text, spans laid end to end from 0)."""
        try:
            enc = self.tok(text, add_special_tokens=specials, return_offsets_mapping=True)
        except NotImplementedError:  # a slow tokenizer of transformers 4 refuses
            enc = self.tok(text, add_special_tokens=specials)
        ids = list(enc["input_ids"])
        if "offset_mapping" in enc:  # (transformers 5's sentencepiece backend leaves it out without a word)
            return ids, [(int(a), int(b)) for a, b in enc["offset_mapping"]]
        offsets, at = [], 0
        for i in range(len(ids)):
            if i == 0:
                size = len(self.tok.decode(ids[:1]))
            else:
                size = len(self.tok.decode(ids[i - 1 : i + 1])) - len(self.tok.decode(ids[i - 1 : i]))
            offsets.append((at, at + size))
            at += size
        return ids, offsets

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    @property
    def sha256(self) -> str:
        """Checksum of the tokenizer's content (same for a directory and a GGUF copy of it)."""
        if self._sha256 is None:
            backend = getattr(self.tok, "backend_tokenizer", None)
            content = backend.to_str() if backend is not None else json.dumps(self.tok.get_vocab(), sort_keys=True)
            specials = json.dumps(self.tok.special_tokens_map, sort_keys=True, default=str)
            self._sha256 = hashlib.sha256((content + specials).encode()).hexdigest()
        return self._sha256

    def describe(self) -> dict[str, Any]:
        return {
            "kind": f"transformers:{type(self.tok).__name__}",
            "path": self.source,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "adds_bos": self.adds_bos,
        }


def adds_bos_by_default(tok: Any) -> bool:
    """Whether encoding a text with the tokenizer's special tokens (its default) puts BOS first: what
    transformers users, and lm-evaluation-harness's HFLM without add_bos_token, feed the model."""
    bos = tok.bos_token_id
    if bos is None:
        return False
    probe = "Hello world"
    with_specials = tok(probe)["input_ids"]
    plain = tok(probe, add_special_tokens=False)["input_ids"]
    return with_specials[:1] == [bos] and plain[:1] != [bos]


class HFCausalLM(StreamingLM):
    """A transformers causal LM; the state is its KV cache, so context is bounded by max_context."""

    family = "hf"

    def __init__(
        self, model: Any, tokenizer: HFTokenizer, path: Path, gguf_file: str | None, max_context: int,
        options: dict[str, Any] | None = None,
    ):  # fmt: skip
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.path = path
        self.gguf_file = gguf_file
        self.max_context = max_context
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._weights_sha256: str | None = None
        self._options = {**(options or {}), "gguf_file": gguf_file, "max_context": max_context}
        self._takes_keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._cache_kw = cache_argument(self.model)
        self.prefill = Prefill(self._options.get("prefill", "auto"))
        self._token_bytes = activation_bytes(model.config, self.dtype)

    def options(self) -> dict[str, Any]:
        """Effective load options, defaults included (max_context as used, gguf_file as found)."""
        return dict(self._options)

    def info_rows(self) -> list[tuple[str, str]]:
        """Rows of `megaeval info`'s table."""
        cfg, tok = self.model.config, self.tokenizer.describe()
        layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", "?")
        hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", "?")
        heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", "?")
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        return [
            ("path", str(self.path / self.gguf_file) if self.gguf_file else str(self.path)),
            ("architecture", type(self.model).__name__),
            ("parameters", f"{sum(p.numel() for p in self.model.parameters()):,}"),
            ("layers × hidden", f"{layers} × {hidden}"),
            ("heads / kv heads", f"{heads} / {kv_heads}"),
            ("max context", f"{self.max_context:,}"),
            ("state per sequence", f"{human_bytes(self.state_bytes(1))} (KV cache at max context)"),
            ("dtype", f"{str(self.dtype).removeprefix('torch.')} on {self.device}"),
            ("tokenizer", str(tok["path"])),
            ("vocabulary", f"{tok['vocab_size']:,} (bos {tok['bos_id']}, eos {tok['eos_id']})"),
        ]

    def init_state(self, batch_size: int) -> HFState:
        return HFState(None, 0, batch_size)

    def check_tokens(self, tokens: Any, state: HFState) -> torch.Tensor:
        """`tokens` as a long tensor, checked to be [B, T] ids of this model that fit `state` within max_context."""
        tokens = torch.as_tensor(tokens, device=self.device)
        if tokens.dim() != 2 or tokens.dtype.is_floating_point:
            raise fail(f"tokens must be an integer tensor [batch, time], got {tokens.dtype} {list(tokens.shape)}")
        if tokens.shape[0] != state.batch_size:
            raise fail(f"tokens have batch size {tokens.shape[0]} but the state was made for {state.batch_size}")
        pads = getattr(state, "pads", None)  # rows stacked from states of different lengths (a sharded state: none)
        longest = state.length - (min(pads) if pads else 0)
        if longest + tokens.shape[1] > self.max_context:
            raise fail(
                f"this state would hold {longest + tokens.shape[1]:,} tokens, beyond max_context {self.max_context:,}",
                "start a new state, or score long inputs with a --window-policy",
            )
        vocab = self.model.config.vocab_size
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise fail(f"token ids must lie in [0, {vocab})", "encode with this model's tokenizer")
        return tokens.long()

    def _steps(self, tokens: torch.Tensor, state: HFState, first: int = 0):
        """Feed `tokens` in calls as the prefill rule plans them (`hf.prefill`; the positions from `first` on in
        calls of at most STEP_TOKENS when more than that many logits are wanted), yielding (position, logits) from
        position `first` on (the output layer runs only there when the model takes logits_to_keep); updates `state`
        in place."""
        if state.cache is None:
            state.cache = growing_cache()
        total = tokens.shape[1]
        head = total if total - first <= STEP_TOKENS else first  # read by the rule; the rest STEP_TOKENS a call
        padded = getattr(state, "pads", None) is not None
        sizes = self.prefill.plan(head, state.length, state.batch_size, padded, self.device, self.dtype,
                                  self._token_bytes) if head else []  # fmt: skip
        sizes += pieces(total - head, STEP_TOKENS)
        start = 0
        for size in sizes:
            piece = tokens[:, start : start + size]
            end = start + size
            keep = end - max(first, start)  # positions of this piece whose logits are wanted
            kwargs = {"logits_to_keep": max(keep, 1)} if self._takes_keep and keep < size else {}
            if padded:  # rows of different lengths: masked padding, own positions
                kwargs.update(_padded_rows(state, size, self.device))
            out = self.model(input_ids=piece, use_cache=True, **{self._cache_kw: state.cache}, **kwargs)
            state.cache = getattr(out, self._cache_kw)
            state.length += size
            if keep > 0:
                logits = out.logits[:, out.logits.shape[1] - keep :]
                yield end - keep, logits.to(torch.promote_types(logits.dtype, torch.float32))
            start = end

    def read_call_tokens(self, length: int) -> int:
        """A prompt reaches this model whole: the prefill rule (`hf.prefill`) cuts it into calls."""
        return max(length, 1)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, state: HFState) -> tuple[torch.Tensor, HFState]:
        """Logits [B, T, V]; the state's KV cache is extended in place and returned."""
        return self.forward_last(tokens, state, torch.as_tensor(tokens).shape[-1])

    @torch.inference_mode()
    def forward_last(self, tokens: torch.Tensor, state: HFState, last: int) -> tuple[torch.Tensor, HFState]:
        """Logits [B, last, V] of the last `last` positions only, and the state (KV cache extended in place)."""
        tokens = self.check_tokens(tokens, state)
        first = tokens.shape[1] - min(max(last, 0), tokens.shape[1])
        parts = [logits for _, logits in self._steps(tokens, state, first)]
        if not parts:
            out_dtype = torch.promote_types(self.dtype, torch.float32)
            return torch.zeros(
                tokens.shape[0], 0, self.model.config.vocab_size, dtype=out_dtype, device=self.device
            ), state
        return torch.cat(parts, dim=1), state

    def advance(self, tokens: torch.Tensor, state: HFState) -> HFState:
        """The KV cache after `tokens`, computing no logits (one position per step, when the model must)."""
        return self.forward_last(tokens, state, 0)[1]

    def read_rows(self, rows: list[list[int]]) -> list[HFState]:
        """Fresh states after each of `rows`, read in one call: rows padded on the left, the padding masked (the
        state's `pads`) and each row's positions its own; then each row's state on its own."""
        if len(rows) < 2:
            return super().read_rows(rows)
        width = max(len(row) for row in rows)
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        for r, row in enumerate(rows):
            tokens[r, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        state = HFState(None, 0, len(rows), [width - len(row) for row in rows])
        state = self.advance(tokens.to(self.device), state)
        return [state.select([r]) for r in range(len(rows))]

    @torch.inference_mode()
    def score(self, inputs: torch.Tensor, targets: torch.Tensor, state: HFState) -> tuple[torch.Tensor, HFState]:
        """NLL [B, T] of `targets`; at most STEP_TOKENS positions of logits are alive at once."""
        inputs = self.check_tokens(inputs, state)
        targets = torch.as_tensor(targets, device=self.device).long()
        if targets.shape != inputs.shape:
            raise fail(f"targets shape {list(targets.shape)} differs from inputs shape {list(inputs.shape)}")
        B, T = inputs.shape
        nll = torch.zeros(B, T, dtype=torch.promote_types(self.dtype, torch.float32), device=self.device)
        for start, logits in self._steps(inputs, state):
            end = start + logits.shape[1]
            nll[:, start:end] = F.cross_entropy(
                logits.flatten(0, 1), targets[:, start:end].flatten(), ignore_index=IGNORE_INDEX, reduction="none"
            ).view(B, -1)
        return nll, state

    def weights_sha256(self) -> str | None:
        """sha256 of the weight file, or of the weight files' checksums in name order."""
        if self._weights_sha256 is None:
            self._weights_sha256 = checkpoint.weights_sha256(self.path, self.gguf_file)
        return self._weights_sha256

    def flops_per_token(self, context_length: int) -> float | None:
        """Matmul FLOPs per token of a fresh pass of `context_length` tokens (`hf.flops`)."""
        return flops.flops_per_token(self.model, context_length)

    def state_bytes(self, batch_size: int = 1) -> int:
        """KV-cache bytes of a state holding max_context tokens (the most it holds)."""
        cfg = self.model.config
        layers = getattr(cfg, "num_hidden_layers", 0)
        heads = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", 0)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        return batch_size * 2 * layers * heads * head_dim * self.max_context * itemsize

    def describe(self) -> dict[str, Any]:
        cfg = self.model.config
        return {
            "family": self.family,
            "path": str(self.path),
            "gguf_file": self.gguf_file,
            "architecture": type(self.model).__name__,
            "config": {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool, type(None)))},
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "chunk_size": None,
            "max_context": self.max_context,
            "state_bytes_per_sequence": self.state_bytes(1),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "stored_dtype": str(getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)),
            "model_parallel_size": None,
            "tokenizer": self.tokenizer.describe(),
            "prefill": self.prefill.describe(),
        }


def _padded_rows(state: Any, steps: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The attention mask (the pad slots of each row off) and position ids (each row's own) of a call of `steps`
    tokens on a state whose rows hold different numbers of tokens."""
    pads = torch.tensor(state.pads, device=device)[:, None]
    slots = torch.arange(state.length + steps, device=device)[None]
    mask = (slots >= pads).long()
    positions = torch.arange(state.length, state.length + steps, device=device)[None] - pads
    return {"attention_mask": mask, "position_ids": positions}


def load_tokenizer(
    path: str | Path, *, gguf_file: str | None = None, trust_remote_code: bool = False, **_model_options: Any
) -> HFTokenizer:
    """The tokenizer of a local transformers model (directory or GGUF), offline."""
    checkpoint.transformers_module()
    trust_remote_code = as_bool("trust_remote_code", trust_remote_code)
    with fast_reading():
        path, gguf_file = locate(Path(path), gguf_file)
        refuse_remote_code(path, trust_remote_code)
        tok = checkpoint.read_tokenizer(path, gguf_file, trust_remote_code)
    return HFTokenizer(tok, str(path / gguf_file) if gguf_file else str(path))


def load(
    path: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    *,
    gguf_file: str | None = None,
    max_context: int | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    prefill: str = "auto",
) -> HFCausalLM:
    """Load a local transformers causal LM. Remote code runs only with trust_remote_code=true; `prefill`: how
    prompts are read (`hf.prefill`: auto, one-call or steps-N)."""
    checkpoint.transformers_module()
    trust_remote_code = as_bool("trust_remote_code", trust_remote_code)
    prefill = parse_prefill(prefill)
    with fast_reading():  # a GGUF file is parsed once for the tokenizer, the config and the weights
        path, gguf_file = locate(Path(path), gguf_file)
        check_weights(path, gguf_file, checkpoint.WEIGHT_SUFFIXES)
        tokenizer = load_tokenizer(path, gguf_file=gguf_file, trust_remote_code=trust_remote_code)
        model = checkpoint.read_model(path, dtype, gguf_file, trust_remote_code, attn_implementation)
    model.to(device)
    max_context = max_context_of(model.config, path, max_context)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise fail(f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the model only {model.config.vocab_size}")
    refuse_non_causal(model, path)
    options = {"trust_remote_code": trust_remote_code, "attn_implementation": attn_implementation,
               "prefill": prefill}  # fmt: skip
    return HFCausalLM(model, tokenizer, path, gguf_file, max_context, options)
