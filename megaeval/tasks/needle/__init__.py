"""Needle in a haystack: passkey retrieval and RULER's eight niah tasks over a length x depth grid, 4K to 1M+.

Rooms: `spec` (task files checked), `haystack` (books, sentences, random keys and values), `prompts` (needles,
rendering, fitting a length; the depths of a sample share one haystack) and `results` (the accuracy grid).
Command: `commands.needle`.
"""
