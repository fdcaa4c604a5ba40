"""Judges: a model (served or in-process) asked to grade answers with judge prompts kept as data (FastChat's
llm_judge format), its replies parsed as FastChat parses them, every reply cached by (judge, rendered prompt)."""
