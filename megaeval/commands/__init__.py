"""One module per megaeval command; `megaeval.cli` declares their options and calls them."""
