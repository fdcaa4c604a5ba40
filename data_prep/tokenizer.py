"""Train a small SentencePiece tokenizer on plain-text books; express it as a transformers tokenizer."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any


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


def hf_tokenizer_from_sentencepiece(sp_model: Path) -> Any:
    """A transformers fast tokenizer giving the same ids as a byte-fallback unigram sentencepiece model.

    transformers 5's LlamaTokenizer always rebuilds a BPE pipeline (vocab + merges), so it cannot hold a
    unigram model. This wraps the pieces and scores in a `tokenizers` Unigram model with byte fallback
    inside the generic PreTrainedTokenizerFast (saved as tokenizer.json), reproducing sentencepiece:
    identity normalisation, the dummy "▁" prefix (always added, even before a space), spaces as "▁",
    words split before each "▁" (no piece holds one elsewhere), and control, unknown and byte pieces
    scored below every path of ordinary pieces. One known difference: text that literally spells such a
    piece ("<s>", "<0x41>") out of characters the vocabulary lacks ("<", ">" here) becomes that piece,
    where sentencepiece falls back to bytes, because `tokenizers` scores an unknown character below
    every piece.
    """
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(sp_model).read_bytes())
    spec, norm = proto.trainer_spec, proto.normalizer_spec
    normal = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
    if spec.model_type != spec.UNIGRAM or not spec.byte_fallback or norm.name != "identity":
        raise ValueError(f"{sp_model}: expected a byte-fallback unigram model with identity normalisation")
    if any("▁" in p.piece[1:] for p in proto.pieces):
        raise ValueError(f"{sp_model}: a piece holds '▁' after its first character; words cannot be split")
    floor = min(p.score for p in proto.pieces if p.type == normal) - 1000.0
    pieces = [(p.piece, p.score if p.type == normal else floor) for p in proto.pieces]
    tok = Tokenizer(models.Unigram(pieces, unk_id=spec.unk_id, byte_fallback=True))
    steps = [normalizers.Prepend("▁")] if norm.add_dummy_prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    strip = [decoders.Strip(" ", 1, 0)] if norm.add_dummy_prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    names = {"unk_token": spec.unk_id, "bos_token": spec.bos_id, "eos_token": spec.eos_id}
    specials = {k: proto.pieces[i].piece for k, i in names.items() if i >= 0}
    return PreTrainedTokenizerFast(tokenizer_object=tok, **specials)
