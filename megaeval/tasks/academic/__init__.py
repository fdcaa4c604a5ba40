"""The short-context academic suite of Llama 2 / MEGALODON Table 1 (MMLU, BoolQ, HellaSwag, PIQA, SIQA, WinoGrande,
ARC-e, ARC-c, NQ, TriviaQA), as lm-evaluation-harness defines and scores it.

Rooms: `docs` (processing, prompts, choices, few-shot as the task files state them), `chat` (the prompts as chat
turns, as lm-eval's --apply_chat_template writes them), `prepare` (documents and exemplars read before the model
loads), `evaluate` (choices scored and answers generated, shared contexts read once) and `results` (scores with
standard errors, MMLU's groups, the average). Command: `commands.academic`.
"""
