"""Evidence across runs: seed statistics, findings and verdicts, compare tables, the results page
and the files a run pack holds."""
