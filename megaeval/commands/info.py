"""`megaeval info`: what a checkpoint is, for any family: its facts as JSON, or its own rows as a table."""

from __future__ import annotations

from typing import Any

from ..errors import fail
from ..models import StreamingLM, load_model, model_options
from ..serving.model import open_served
from ..serving.spec import is_served
from ..tables import render_rows


def load_for_info(spec: str | None, model_args: dict[str, Any], device: str, dtype: str,
                  kernels: str | None = None) -> StreamingLM:  # fmt: skip
    """Load a model as `megaeval info` describes it (a served one: ask its server)."""
    if is_served(spec):
        if (device, dtype, kernels) != ("cpu", "float32", None):
            raise fail("--device, --dtype and --kernels apply to a model megaeval loads, not to a served one",
                       "drop them: the server chooses how it runs the model")  # fmt: skip
        return open_served(spec, model_args)
    return load_model(spec, device=device, dtype=dtype, **model_options(spec, model_args, kernels=kernels))


LOAD_TIME = "load time"  # info's last row (the golden files mask its value)


def info_table(lm: StreamingLM, load_seconds: float | None = None) -> str:
    """The model's own description rows as a two-column table, never wrapped; then the load time when given (from
    the spec to a model ready to run: the family's libraries imported, its files read and checked; a served model's
    server asked)."""
    rows = lm.info_rows() + ([(LOAD_TIME, f"{load_seconds:.2f} s")] if load_seconds is not None else [])
    return render_rows(f"{lm.family} model", rows)
