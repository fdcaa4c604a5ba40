"""OpenAI MRCR (multi-round co-reference resolution, openai/mrcr): a long synthetic chat holding 2, 4 or 8 identical
asks, the model asked to reproduce the i-th answer behind a random prefix; graded by the dataset card's `grade()`.

Rooms: `data` (the records in the hub's two layouts, checked), `o200k` (o200k_base offline: the token counts the
bins are made of), `prompts` (the messages as the model reads them), `results` (per needle count and bin means),
`tables` (the report's tables, read and checked). Scoring: `metrics.mrcr`; command: `commands.mrcr`.
"""
