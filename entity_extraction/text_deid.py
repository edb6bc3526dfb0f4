"""The English report scrubber under its first name (the build, the DICOM text scrubber and other callers import it
from here); the code is in :mod:`entity_extraction.deid`."""

from entity_extraction.deid.scrubber import PhiPatternsError, deidentify_text

__all__ = ["PhiPatternsError", "deidentify_text"]
