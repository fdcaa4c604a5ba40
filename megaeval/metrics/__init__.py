"""Task metrics: the SCROLLS scorer in `megaeval.metrics.scrolls`."""
