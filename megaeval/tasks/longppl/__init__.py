"""LongPPL (Fang et al., ICLR 2025): perplexity on the key tokens, those an evaluator predicts far better with the
whole document than with a short window.

Rooms: `data` (the key-token file and its settings; documents are read by `tasks.data.read_documents`). The arithmetic
(windows, key positions, spans, pooling) is `metrics.longppl`; commands: `commands.longppl` and the sweep's
`commands.ppl_sweep_keys`.
"""
