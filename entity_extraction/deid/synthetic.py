"""Generated report notes with HIPAA identifiers and their answer keys (the outside set of ``medreco eval deid``).

Each note is a few sentences of ``synthetic_templates.json``: PHI sentences whose ``{slot}`` markers are filled
by ``Faker`` (one locale per note, drawn from :data:`LOCALES`) and clinical sentences without PHI (eponyms,
anatomy, findings, measurements, drug names) that must survive. Every filled slot is one PHI span of the answer
key, typed with the names of :data:`SLOTS` (``NAME``, ``RELATIVE``, ``HCP``, ``DATE``, ``YEAR``, ``AGE``,
``PHONE``, ``EMAIL``, ``URL``, ``IP``, ``ADDRESS``, ``CITY``, ``POSTCODE``, ``ORGANIZATION``, ``ID``, ``IBAN``,
``CARD``), the Safe Harbor classes of 45 CFR 164.514(b)(2).

Generation is deterministic: one :class:`random.Random` and ``Faker.seed_instance`` per note from ``seed``; the
same seed and Faker version give the same notes (nothing is stored). Templates with an even index are the
development split, odd ones the held-out split (never looked at while rules are written).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from entity_extraction.deid.evaluation import GoldNote
from schemas.errors import ReasonCodedError

TEMPLATES_FILE = Path(__file__).with_name("synthetic_templates.json")
#: Faker locales, one drawn per note: English-speaking countries and three European ones whose names and
#: addresses appear in English reports
LOCALES = ("en_US", "en_GB", "en_IE", "en_AU", "de_DE", "fr_FR", "es_ES")
_SLOT = re.compile(r"\{(\w+)\}")
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def _date(fake, rng: random.Random) -> str:
    d = fake.date_between(dt.date(1990, 1, 1), dt.date(2025, 12, 31))
    forms = (
        f"{d.month:02d}/{d.day:02d}/{d.year}",
        f"{d.day}/{d.month}/{d.year}",
        d.isoformat(),
        f"{d.month}/{d.day}",
        f"{d.day:02d}.{d.month:02d}.{d.year}",
    )
    return rng.choice(forms)


def _date_long(fake, rng: random.Random) -> str:
    d = fake.date_between(dt.date(1990, 1, 1), dt.date(2025, 12, 31))
    month = _MONTHS[d.month - 1]
    forms = (
        f"{month} {d.day}, {d.year}",
        f"{d.day} {month} {d.year}",
        f"{month[:3]} {d.day} {d.year}",
        f"{d.day}-{month[:3].upper()}-{d.year}",
        f"{month} {d.day}",
    )
    return rng.choice(forms)


def _hospital(fake, rng: random.Random) -> str:
    forms = (
        f"{fake.city()} General Hospital",
        f"St. {fake.last_name()} Medical Center",
        f"{fake.last_name()} Memorial Hospital",
        f"{fake.city()} Radiology Clinic",
        f"{fake.last_name()} Imaging Centre",
        f"University Hospital {fake.city()}",
    )
    return rng.choice(forms)


def _school(fake, rng: random.Random) -> str:
    forms = (
        f"{fake.city()} High School",
        f"University of {fake.city()}",
        f"{fake.last_name()} College",
        f"{fake.last_name()} Elementary School",
    )
    return rng.choice(forms)


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


#: slot -> (PHI type of the answer key, value from (faker, rng))
SLOTS: dict[str, tuple[str, Callable[[object, random.Random], str]]] = {
    "patient": ("NAME", lambda f, r: f"{f.first_name()} {f.last_name()}"),
    "patient_first": ("NAME", lambda f, r: f.first_name()),
    "patient_last": ("NAME", lambda f, r: f.last_name()),
    "relative": ("RELATIVE", lambda f, r: f"{f.first_name()} {f.last_name()}"),
    "relative_first": ("RELATIVE", lambda f, r: f.first_name()),
    "relative_last": ("RELATIVE", lambda f, r: f.last_name()),
    "hcp": ("HCP", lambda f, r: f"{f.first_name()} {f.last_name()}"),
    "hcp2": ("HCP", lambda f, r: f"{f.first_name()} {f.last_name()}"),
    "hcp_first": ("HCP", lambda f, r: f.first_name()),
    "hcp_last": ("HCP", lambda f, r: f.last_name()),
    "date": ("DATE", _date),
    "date_long": ("DATE", _date_long),
    "dob": ("DATE", _date),
    "year": ("YEAR", lambda f, r: str(r.randint(1975, 2024))),
    "age90": ("AGE", lambda f, r: str(r.randint(90, 104))),
    "phone": ("PHONE", lambda f, r: f.phone_number()),
    "email": ("EMAIL", lambda f, r: f.email()),
    "url": ("URL", lambda f, r: f.url()),
    "ip": ("IP", lambda f, r: f.ipv4() if r.random() < 0.8 else f.ipv6()),
    "street": ("ADDRESS", lambda f, r: f.street_address()),
    "city": ("CITY", lambda f, r: f.city()),
    "postcode": ("POSTCODE", lambda f, r: f.postcode()),
    "hospital": ("ORGANIZATION", _hospital),
    "hospital2": ("ORGANIZATION", _hospital),
    "company": ("ORGANIZATION", lambda f, r: f.company()),
    "school": ("ORGANIZATION", _school),
    "mrn": ("ID", lambda f, r: r.choice(("", "MRN", "A")) + _digits(r, r.randint(6, 9))),
    "accession": ("ID", lambda f, r: f"{r.choice(('ACC', 'RAD', 'CT'))}{_digits(r, 8)}"),
    "ssn": ("ID", lambda f, r: f"{_digits(r, 3)}-{_digits(r, 2)}-{_digits(r, 4)}"),
    "iban": ("IBAN", lambda f, r: f.iban()),
    "card": ("CARD", lambda f, r: f.credit_card_number()),
}


class SyntheticTemplateError(ReasonCodedError, ValueError):
    """A template file that cannot be used (reason ``synthetic_templates_invalid``): unknown slot, no sentences."""

    default_reason = "synthetic_templates_invalid"
    message_format = "{message}"


@lru_cache(maxsize=2)
def load_templates(path: str | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(phi_sentences, clinical_sentences)`` of the templates file.

    Raises
    ------
    SyntheticTemplateError
        If a list is missing or empty, or a sentence names a slot that :data:`SLOTS` lacks.
    """
    data = json.loads(Path(path or TEMPLATES_FILE).read_text(encoding="utf-8"))
    phi, clinical = tuple(data.get("phi_sentences") or ()), tuple(data.get("clinical_sentences") or ())
    if not phi or not clinical:
        raise SyntheticTemplateError("templates need non-empty 'phi_sentences' and 'clinical_sentences'")
    for sentence in phi:
        unknown = set(_SLOT.findall(sentence)) - set(SLOTS)
        if unknown:
            raise SyntheticTemplateError(f"unknown slot(s) {sorted(unknown)} in a template")
    return phi, clinical


def _fill(template: str, fake, rng: random.Random, text: list[str], spans: list[tuple[int, int, str]]) -> None:
    pos = 0
    offset = sum(len(t) for t in text)
    for m in _SLOT.finditer(template):
        text.append(template[pos : m.start()])
        offset += m.start() - pos
        kind, make = SLOTS[m.group(1)]
        value = " ".join(make(fake, rng).split())  # Faker addresses may hold newlines or trailing spaces
        text.append(value)
        spans.append((offset, offset + len(value), kind))
        offset += len(value)
        pos = m.end()
    text.append(template[pos:])


def generate_notes(n: int, seed: int = 0, split: str = "held_out", path: str | None = None) -> list[GoldNote]:
    """``n`` generated notes with answer keys.

    Parameters
    ----------
    n : int
        Notes to make (each: 2-4 PHI sentences of the split and 2-3 clinical sentences, shuffled).
    seed : int
        Seed of the note generator; note ``i`` uses ``seed * 1_000_003 + i`` for its ``random.Random`` and Faker.
    split : {"dev", "held_out", "all"}
        Which PHI templates: even indices (dev), odd (held_out) or all.
    path : str, optional
        Alternative templates file.

    Returns
    -------
    list of GoldNote
        ``id`` ``"syn-<split>-<seed>-<i>"``; ``phi`` spans as ``(start, end, type)`` in text order.

    Raises
    ------
    ValueError
        If ``split`` is none of the three.
    SyntheticTemplateError
        If the templates file cannot be used.
    """
    from faker import Faker

    phi, clinical = load_templates(path)
    if split not in ("dev", "held_out", "all"):
        raise ValueError(f"split must be dev, held_out or all, not {split!r}")
    pool = phi if split == "all" else phi[0 if split == "dev" else 1 :: 2]
    fakers = {loc: Faker(loc) for loc in LOCALES}
    notes = []
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        fake = fakers[rng.choice(LOCALES)]
        fake.seed_instance(seed * 1_000_003 + i)
        sentences = [(True, s) for s in rng.sample(pool, k=min(len(pool), rng.randint(2, 4)))]
        sentences += [(False, s) for s in rng.sample(clinical, k=rng.randint(2, 3))]
        rng.shuffle(sentences)
        text: list[str] = []
        spans: list[tuple[int, int, str]] = []
        for j, (has_phi, sentence) in enumerate(sentences):
            if j:
                text.append(rng.choice((" ", "\n", "\n\n")))
            if has_phi:
                _fill(sentence, fake, rng, text, spans)
            else:
                text.append(sentence)
        notes.append(GoldNote(f"syn-{split}-{seed}-{i}", "".join(text), tuple(spans)))
    return notes
