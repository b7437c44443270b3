"""A run's directory: its layout, storage, config file and history, checkpoints (save, restore,
integrity, owner), the lock, resume and identity, the records (metrics, TensorBoard, W&B) and the
read-only side analysis and export use. Imports no model, train or analysis code."""
