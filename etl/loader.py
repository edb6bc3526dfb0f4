"""Import path kept for the README of releases before the layout of subpackages: the loader is
:mod:`etl.snapshots.loader` (``from etl.snapshots import load_image, to_tensor``)."""

from etl.snapshots.loader import load_image, png_spacing_mm, to_tensor

__all__ = ["load_image", "png_spacing_mm", "to_tensor"]
