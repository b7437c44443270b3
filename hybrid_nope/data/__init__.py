"""Data: byte tokenizer, embedded stdlib corpus, document packing, grain pipeline.

Import the submodules directly (e.g. `from hybrid_nope.data import pipeline`); this package
file stays empty so that importing the tokenizer does not pull in grain or read the stdlib.
"""
