"""Tesseract OCR is required by the burned-in text tests: they fail naming what is missing, never skip."""

import pytest

from etl.deid.burned_in_text import ocr_available


def require_ocr() -> None:
    """Fail the calling test when OCR cannot run here (names Debian tesseract-ocr-eng or tesserocr)."""
    problem = ocr_available()
    if problem:
        pytest.fail(
            f"burned-in text OCR unavailable: {problem} (`make tools` installs tesseract-ocr, tesseract-ocr-eng)",
            pytrace=False,
        )
