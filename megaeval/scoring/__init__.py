"""Model-side building blocks: prefill and greedy decoding, log-likelihoods, windows, the sweep plan."""
