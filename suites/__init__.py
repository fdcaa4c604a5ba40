"""Evaluation task definitions as data (installed as megaeval.suites)."""
