"""Export of a trained run to other frameworks' formats (hf: the SmolLM3 layout of transformers)."""
