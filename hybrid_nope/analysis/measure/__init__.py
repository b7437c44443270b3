"""The in-loop measurement: recency statistics, the probe, theory, records, the hook and its
live figures. The training loop (through launch/train.py) depends on this room alone, and on
present/plots for the live figures."""
