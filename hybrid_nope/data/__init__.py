"""Data, in rooms by job:

  sources/       where rows come from: one module per source (the embedded stdlib corpus,
                 ProLong's MDS mixture, a prepared documents directory and the prose corpus
                 that fills one, text files (a BPE's ids cached once), the TextbookChapters
                 eval set) and `sources.registry`, the one place `data.source` is dispatched on
  formats/       how data is stored: MDS (`formats.mds`), text files, their length index and ids
  tokenization/  the byte tokenizer, tokenizer.json files, BPE training, text <-> ids for a run
  pipeline/      packing into rows, the mixture of domains, the grain loader (train iterator,
                 eval batches, probe pool)
  check.py, fingerprint.py, repetition.py: what a run asks of its data as a whole (is it in
                 place, what identifies it at resume, how its tokens repeat)

`mds.py` keeps the contract name `hybrid_nope.data.mds.MDSDataset` (DESIGN.md).
Import the submodules directly (e.g. `from hybrid_nope.data.pipeline import loader`); the
package files stay empty so that importing the tokenizer does not pull in grain or read the
stdlib.
"""
