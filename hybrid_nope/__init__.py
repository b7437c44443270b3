"""hybrid_nope: pretraining hybrid SWA / global-NoPE language models and measuring recency."""
