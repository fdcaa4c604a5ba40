"""The books stream: one module owns its format (`format`), `megaeval prep-books` writes it, `reader` reads it."""

from .format import MANIFEST_FILE, STREAM_KIND, TOKENS_FILE, token_dtype, validate_manifest
from .reader import BooksStream, TextSpan

__all__ = ["BooksStream", "TextSpan", "MANIFEST_FILE", "STREAM_KIND", "TOKENS_FILE", "token_dtype", "validate_manifest"]
