"""The KL measurement: prompts as token ids, both arms' logits, per-token divergence, the reference
cache, the result and `assert_kl_below`."""
