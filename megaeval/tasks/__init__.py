"""Task data: local or hub splits, SCROLLS examples and prompts, academic documents, requests and results."""
