"""Data: byte tokenizer, embedded stdlib corpus, document packing, grain pipeline; for the
paper runs the MDS reader (mds), the ProLong mixture and rows (prolong) and the
TextbookChapters eval set (textbook_chapters).

Import the submodules directly (e.g. `from hybrid_nope.data import pipeline`); this package
file stays empty so that importing the tokenizer does not pull in grain or read the stdlib.
"""
