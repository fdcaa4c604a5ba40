"""Token-by-token float64 RFA, written straight from the format's equations (the test reference).

Independent of megaeval.models.rfa: reads config.json and model.safetensors itself and loops over
tokens, layers and heads with the recurrences S_t = g S_{t-1} + (1 - g) phi(k) v^T, z_t = ... .
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file

F64 = torch.float64


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean()
    var = ((x - mean) ** 2).mean()
    return (x - mean) / math.sqrt(var + eps) * w + b


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def phi(x: torch.Tensor, w: torch.Tensor, kind: str) -> torch.Tensor:
    """x [d] (unit), w [F, d] -> features."""
    proj = w @ x
    scale = math.sqrt(1.0 / w.shape[0])
    if kind == "gaussian":
        return torch.cat([torch.sin(proj), torch.cos(proj)]) * scale
    return torch.clamp(proj, min=0.0) * scale


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / max(float(x.norm()), 1e-6)


def naive_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    floor: float,
    s: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One head, token loop: phi_q, phi_k [T, R], v [T, d], g [T] (None: ungated)."""
    T, R = phi_q.shape
    s = torch.zeros(R, v.shape[1], dtype=F64) if s is None else s.clone()
    z = torch.zeros(R, dtype=F64) if z is None else z.clone()
    out = []
    for t in range(T):
        if g is None:
            s = s + torch.outer(phi_k[t], v[t])
            z = z + phi_k[t]
        else:
            s = g[t] * s + (1 - g[t]) * torch.outer(phi_k[t], v[t])
            z = g[t] * z + (1 - g[t]) * phi_k[t]
        out.append((phi_q[t] @ s) / max(float(phi_q[t] @ z), floor))
    return torch.stack(out), s, z


def read(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    cfg = json.loads((path / "config.json").read_text())
    sd = {k: v.to(F64) for k, v in load_file(str(path / "model.safetensors")).items()}
    return cfg, sd


def naive_logits(path: Path, tokens: list[int]) -> torch.Tensor:
    """Logits [T, V] of one sequence, from position 0."""
    cfg, sd = read(path)
    D, H, L = cfg["model_dim"], cfg["num_heads"], cfg["num_layers"]
    d, eps = D // H, cfg["norm_eps"]
    out_w = sd["embed.weight"] if cfg["tie_embeddings"] else sd["output.weight"]
    states: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (layer, head) -> (S, z)
    logits = []
    for pos, tok in enumerate(tokens):
        angles = [pos / 10000 ** (2 * (i // 2) / D) for i in range(D)]  # PE[pos, 2j], PE[pos, 2j+1]
        pe = torch.tensor([math.sin(a) if i % 2 == 0 else math.cos(a) for i, a in enumerate(angles)], dtype=F64)
        x = sd["embed.weight"][tok] * math.sqrt(D) + pe
        for i in range(L):
            p = f"layers.{i}."
            a = layer_norm(x, sd[p + "attn_norm.weight"], sd[p + "attn_norm.bias"], eps)
            q, k, v = (sd[p + f"attn.{n}_proj.weight"] @ a for n in "qkv")
            heads = []
            for h in range(H):
                w = sd[p + "attn.random_matrices"][h] * sd[p + "attn.sigma"][h]
                fq = phi(unit(q[h * d : (h + 1) * d]), w, cfg["feature_map"])
                fk = phi(unit(k[h * d : (h + 1) * d]), w, cfg["feature_map"])
                vh = v[h * d : (h + 1) * d]
                if cfg["gated"]:
                    g = torch.sigmoid(sd[p + "attn.gate.weight"][h] @ a + sd[p + "attn.gate.bias"][h])
                    g = g.reshape(1)
                else:
                    g = None
                s, z = states.get((i, h), (None, None))
                o, s, z = naive_attention(fq[None], fk[None], vh[None], g, cfg["denominator_floor"], s, z)
                states[(i, h)] = (s, z)
                heads.append(o[0])
            x = x + sd[p + "attn.o_proj.weight"] @ torch.cat(heads)
            y = layer_norm(x, sd[p + "ffn_norm.weight"], sd[p + "ffn_norm.bias"], eps)
            y = sd[p + "ffn.fc1.weight"] @ y + sd[p + "ffn.fc1.bias"]
            x = x + sd[p + "ffn.fc2.weight"] @ gelu(y) + sd[p + "ffn.fc2.bias"]
        logits.append(out_w @ layer_norm(x, sd["final_norm.weight"], sd["final_norm.bias"], eps))
    return torch.stack(logits)
