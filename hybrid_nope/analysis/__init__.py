"""Analysis, in four rooms by job (docs/architecture.md draws them):

  measure/     the in-loop measurement: recency statistics, the probe, the theory, the records,
               the hook the training loop is handed, and its live figures
  checkpoint/  what one checkpoint is used for: load, analyze (report), score, generate, init null
  evidence/    evidence across runs: seed statistics, findings and verdicts, compare, results page
  present/     presentation: plots and the HTML report

`hybrid_nope.analysis.recency` and `hybrid_nope.analysis.theory` are contracts (DESIGN.md) and
stay importable under those names.
"""
