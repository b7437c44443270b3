"""Token ids: the byte tokenizer and tokenizer.json files (`tokenizer`), the byte-level BPE trained
for a prepared corpus (`bpe`), and a run's text to ids and back (`text_codec`)."""
