"""Where rows come from: one module per source, and `registry`, the one place `data.source` is
read and dispatched on (its names, readers, fingerprints, tokenizers and the checks of its keys)."""
