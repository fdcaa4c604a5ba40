"""BABILong (Kuratov et al., NeurIPS 2024): the 20 bAbI reasoning tasks with their facts hidden in book text, on the
published sets from 0k to 10M tokens, as booydar/babilong runs and scores them.

Rooms: `spec` (task files checked; the sets' length names), `data` (the sets in the layouts users have), `prompts`
(the official prompt and its name), `generator` (BABILong's instance generator, seeded) with `tokenizer` (GPT-2's,
which lengths count in) and `sentences` (the sentence split of BABILong's pinned nltk 3.8.1), `predictions` (the
official prediction files) and `results` (accuracy per task and length, the qa1-qa5 average). Scoring:
`metrics.babilong`; command: `commands.babilong` (and `commands.babilong_files`).
"""
