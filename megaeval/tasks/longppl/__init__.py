"""LongPPL (Fang et al., ICLR 2025): perplexity on the key tokens, those an evaluator predicts far better with the
whole document than with a short window.

Rooms: `data` (documents, read as `prep-books` reads books; the key-token file and its settings). The arithmetic
(windows, key positions, spans, pooling) is `metrics.longppl`; commands: `commands.longppl` and the sweep's
`commands.ppl_sweep_keys`.
"""
