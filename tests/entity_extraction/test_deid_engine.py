"""The engine that the English scrubber and the de/fr/es packs share: resolution of competing findings, the rewrite
and the date arithmetic (duplicates finding D7)."""

from __future__ import annotations

import datetime as dt

from entity_extraction.deid import engine, scrubber
from entity_extraction.deid.engine import Hit, accept, render, shift_date, year4
from entity_extraction.languages import local_deid


def test_earlier_group_wins_then_longer_span():
    text = "Dr Ann Lee 2023"
    first = [Hit(3, 6, "NAME", "[NAME]")]
    second = [Hit(3, 10, "NAME", "[NAME]"), Hit(7, 10, "LOCATION", "[LOCATION]"), Hit(11, 15, "DATE", "[DATE]")]
    accepted, taken = accept([first, second, [Hit(0, 0, "ID", "[ID]")]], len(text))
    # (3, 10) overlaps the earlier group's hit; the longer (11, 15) is taken before (7, 10); the empty hit is dropped
    assert accepted == [first[0], second[2], second[1]]
    assert bytes(taken) == b"\x00" * 3 + b"\x01" * 3 + b"\x00" + b"\x01" * 3 + b"\x00" + b"\x01" * 4
    assert render(text, accepted) == ("Dr [NAME] [LOCATION] [DATE]", {"DATE": 1, "LOCATION": 1, "NAME": 1})


def test_within_a_group_the_longer_span_wins():
    accepted, _ = accept([[Hit(0, 3, "NAME", "a"), Hit(0, 7, "ORGANIZATION", "b")]], 10)
    assert accepted == [Hit(0, 7, "ORGANIZATION", "b")]


def test_date_arithmetic():
    assert shift_date(2024, 2, 29, -17) == dt.date(2024, 2, 12)
    assert shift_date(2023, 2, 29, 5) is None  # no such day
    assert shift_date(1700, 1, 1, 5) is None and shift_date(2020, 1, 1, None) is None
    assert year4("1997") == 1997 and year4("97") == 1997 and year4("05") == 2005


def test_both_engines_use_it():
    for module in (scrubber, local_deid):
        assert module.Hit is engine.Hit and module.accept is engine.accept and module.render is engine.render
    assert scrubber.deidentify_text("Seen 03/14/2023 by Dr. Kernan.", known_phi=[], date_shift_days=-17) == (
        "Seen 02/25/2023 by Dr. [NAME].",
        {"DATE": 1, "NAME": 1},
    )
