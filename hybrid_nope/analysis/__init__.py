"""Recency metrics, the theory they are checked against, the in-loop hook and plots."""
