"""What one checkpoint is used for: loading it, the analysis report, scoring, generation, the
empirical init null."""
