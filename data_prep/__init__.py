"""Turning raw sources (books, jsonl, parquet, datasets) into megaeval inputs (installed as megaeval.data_prep)."""
