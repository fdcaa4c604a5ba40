"""SCROLLS long-document QA as MEGALODON's Table 2 runs it: NarrativeQA (F1), Qasper (F1), QMSum (geometric ROUGE),
prompt `{CONTEXT} Q: {QUESTION} A:`, greedy answers.

Rooms: `docs` (rows to examples, prompts, fitting a fixed context, exemplar draws), `prepare` (choices, examples
and exemplars, read before the model loads), `evaluate` (the few-shot prefix read once, each prompt answered) and
`results` (corpus scores; given predictions scored without a model). Metrics: `metrics.scrolls`. Command:
`commands.scrolls`.
"""
