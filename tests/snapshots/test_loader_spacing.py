"""The PNG pixel spacing an ML user gets from medreco_reader.tensors: source PixelSpacing scaled by the recorded
resize."""

from __future__ import annotations

import pytest


def test_png_spacing_follows_the_resize_step():
    from medreco_reader.tensors import png_spacing_mm

    recipe = {"steps": [{"step": "decode"}, {"step": "resize", "from": [317, 184], "to": [256, 149]}]}
    got = png_spacing_mm([1.2, 1.2], recipe)
    assert got == pytest.approx([1.2 * 317 / 256, 1.2 * 184 / 149])
    assert png_spacing_mm([0.5, 0.4], {"steps": []}) == [0.5, 0.4]
    assert png_spacing_mm(None, recipe) is None
