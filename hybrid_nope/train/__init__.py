"""Training: state and optimizer, steps, loop, checkpoints, metrics."""
