"""Import path kept for the README of releases before the layout of subpackages: the torch Datasets are
:mod:`etl.snapshots.torch_data` (importing it imports torch)."""

from etl.snapshots.torch_data import ImageDataset, ImageStore, PairDataset, TensorShape, VQADataset, collate

__all__ = ["ImageDataset", "ImageStore", "PairDataset", "TensorShape", "VQADataset", "collate"]
