"""Train a small SentencePiece tokenizer on plain-text books."""

from __future__ import annotations

import io
from pathlib import Path


def train_sentencepiece(texts: list[Path], out_path: Path, vocab_size: int = 4096) -> Path:
    """Train a byte-fallback unigram model on the lines of `texts`; deterministic (one thread).

    Identity normalisation keeps the text as written; byte fallback makes every string encodable,
    so a newline is a single token (<0x0A>), which generation can stop on.
    """
    import sentencepiece as spm

    lines = [line for path in texts for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(model.getvalue())
    return out_path
