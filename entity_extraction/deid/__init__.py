"""Report (free-text) de-identification, English.

Public entry point: :func:`deidentify_text` (``text, *, known_phi, date_shift_days, ...`` ->
``(text, counts)``), what ``medreco reports annotate``, the build and the DICOM text-element scrubber call.

Modules, one thing each:

* :mod:`.scrubber` - :func:`deidentify_text`: runs the recognisers in a fixed order, earlier ones win; dates
  are shifted in their own format;
* :mod:`.engine` - what every language shares (also the de/fr/es packs of
  :mod:`entity_extraction.languages.local_deid`): resolving competing hits, rewriting the text, date arithmetic;
* :mod:`.recognisers` - identifiers found by libraries and checksums (street addresses with ``usaddress``,
  postcodes, IP addresses, IBAN, card numbers, e-mail, URLs, years beside dates);
* :mod:`.lexicon` - the word classes (known-safe, ambiguous, first name, surname, city ...) and cue lists;
* :mod:`.name_rules` - the fail-closed name and place rules, one function per rule, run in :data:`RULES` order;
* :mod:`.evaluation` - the strict-recall scorer and the k-fold split of ``medreco eval deid``;
* :mod:`.synthetic` - generated notes with HIPAA identifiers (Faker, several locales) and their answer keys.
"""

from entity_extraction.deid.scrubber import PhiPatternsError, deidentify_text

__all__ = ["PhiPatternsError", "deidentify_text"]
