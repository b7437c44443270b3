"""The contract name `hybrid_nope.data.mds.MDSDataset` (DESIGN.md); the MDS format lives in
hybrid_nope.data.formats.mds."""
from hybrid_nope.data.formats.mds import MDSDataset

__all__ = ["MDSDataset"]
