"""Presentation: plots (static and TensorBoard) and the HTML report."""
