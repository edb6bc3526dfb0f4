"""Seeded synthetic radiology reports in German, French and Spanish with a PHI answer key and labelled findings.

No public de-identification gold standard of radiology reports exists in these languages here, so reports are
generated: ``Faker`` (``de_DE``, ``fr_FR``, ``es_ES``) draws names, streets, postcodes, cities, phone numbers;
templates of our own (headers as German, French and Spanish radiology departments write them, in several
layouts) place them, and finding sentences with a known concept and assertion (:data:`FINDINGS`) fill the body.
Each document: ``{"id", "language", "text", "phi": [{"start", "end", "type", "value"}], "entities": [{"start",
"end", "entity_id", "assertion"}]}`` (the layout of ``../shared/data/text-deid-es``).

Names can be held out of the rules: :func:`generate` draws person names only from ``names`` when given, and the
evaluation (:mod:`entity_extraction.languages.evaluate`) removes those names from the gazetteer, so the name figure
measures the title, label and context rules on names the rules never saw.
"""

from __future__ import annotations

import random

#: finding sentences per language: (sentence, concept id, assertion); "{L}" is a laterality word of the language.
FINDINGS: dict[str, list[tuple[str, str, str]]] = {
    "de": [
        ("Kein Pleuraerguss.", "F029", "absent"),
        ("Kein Nachweis eines Pleuraergusses.", "F029", "absent"),
        ("Pleuraerguss {L}.", "F029", "present"),
        ("Schmaler Pleuraerguss beidseits.", "F029", "present"),
        ("Kein pneumonisches Infiltrat.", "F007", "absent"),
        ("Infiltrat im {L} Unterlappen.", "F007", "present"),
        ("V.a. Pneumonie im {L} Unterlappen.", "C006", "uncertain"),
        ("Verdacht auf beginnende Pneumonie.", "C006", "uncertain"),
        ("Keine Pneumonie.", "C006", "absent"),
        ("Kardiomegalie.", "F018", "present"),
        ("Keine Kardiomegalie.", "F018", "absent"),
        ("Herz nicht vergrößert, keine Kardiomegalie.", "F018", "absent"),
        ("Plattenatelektase {L} basal.", "F019", "present"),
        ("Keine Atelektasen.", "F019", "absent"),
        ("Zeichen der pulmonalvenösen Stauung.", "F009", "present"),
        ("Keine Lungenstauung.", "F009", "absent"),
        ("Elongierte Aorta.", "F014", "present"),
        ("Aortensklerose.", "F020", "present"),
        ("Verkalktes Granulom im {L} Oberfeld.", "F016", "present"),
        ("Fraglicher Rundherd {L} apikal.", "F016", "uncertain"),
        ("Kein Perikarderguss.", "F024", "absent"),
        ("Rippenfraktur {L}, nicht sicher auszuschließen.", "F006", "uncertain"),
        ("Keine Rippenfraktur.", "F006", "absent"),
        ("Milchglastrübungen beidseits.", "F005", "present"),
        ("Keine Milchglastrübungen.", "F005", "absent"),
        ("Hiatushernie.", "F027", "present"),
        ("Skoliose der Brustwirbelsäule.", "F011", "present"),
        ("Am ehesten Atelektase, DD Infiltrat.", "F019", "present"),
        ("Ohne Nachweis einer Kardiomegalie.", "F018", "absent"),
    ],
    "fr": [
        ("Pas d'épanchement pleural.", "F029", "absent"),
        ("Absence d'épanchement pleural.", "F029", "absent"),
        ("Épanchement pleural {L} de faible abondance.", "F029", "present"),
        ("Comblement du cul-de-sac {L}.", "F029", "present"),
        ("Pas de foyer de condensation.", "F007", "absent"),
        ("Foyer de condensation lobaire inférieur {L}.", "F007", "present"),
        ("Opacité évoquant une pneumopathie {L}.", "C006", "uncertain"),
        ("Suspicion de pneumopathie.", "C006", "uncertain"),
        ("Pas de pneumopathie.", "C006", "absent"),
        ("Cardiomégalie.", "F018", "present"),
        ("Pas de cardiomégalie.", "F018", "absent"),
        ("Silhouette cardiaque normale, sans cardiomégalie.", "F018", "absent"),
        ("Atélectasie en bande basale {L}.", "F019", "present"),
        ("Pas d'atélectasie.", "F019", "absent"),
        ("Signes de surcharge vasculaire.", "F009", "present"),
        ("Pas de surcharge vasculaire.", "F009", "absent"),
        ("Aorte déroulée.", "F014", "present"),
        ("Calcifications aortiques.", "F020", "present"),
        ("Granulome calcifié apical {L}.", "F016", "present"),
        ("Nodule douteux apical {L}.", "F016", "uncertain"),
        ("Pas d'épanchement péricardique.", "F024", "absent"),
        ("Possible fracture costale {L}.", "F006", "uncertain"),
        ("Pas de fracture costale.", "F006", "absent"),
        ("Plages de verre dépoli bilatérales.", "F005", "present"),
        ("Pas de verre dépoli.", "F005", "absent"),
        ("Hernie hiatale.", "F027", "present"),
        ("Scoliose dorsale.", "F011", "present"),
        ("Majoration de l'épanchement pleural {L}.", "F029", "present"),
        ("Atélectasie probable.", "F019", "present"),
    ],
    "es": [
        ("No se observa derrame pleural.", "F029", "absent"),
        ("Sin derrame pleural.", "F029", "absent"),
        ("Derrame pleural {L}.", "F029", "present"),
        ("Pinzamiento del seno costofrénico {L}.", "F029", "present"),
        ("No se observan consolidaciones.", "F007", "absent"),
        ("Consolidación en lóbulo inferior {L}.", "F007", "present"),
        ("Posible neumonía en lóbulo inferior {L}.", "C006", "uncertain"),
        ("Sospecha de neumonía.", "C006", "uncertain"),
        ("Sin signos de neumonía.", "C006", "absent"),
        ("Cardiomegalia.", "F018", "present"),
        ("No hay cardiomegalia.", "F018", "absent"),
        ("Silueta cardíaca normal, sin cardiomegalia.", "F018", "absent"),
        ("Atelectasia laminar basal {L}.", "F019", "present"),
        ("No se aprecian atelectasias.", "F019", "absent"),
        ("Signos de congestión pulmonar.", "F009", "present"),
        ("Sin congestión pulmonar.", "F009", "absent"),
        ("Elongación aórtica.", "F014", "present"),
        ("Calcificaciones aórticas.", "F020", "present"),
        ("Granuloma calcificado en vértice {L}.", "F016", "present"),
        ("Nódulo dudoso en vértice {L}.", "F016", "uncertain"),
        ("No se observa derrame pericárdico.", "F024", "absent"),
        ("No se puede descartar fractura costal {L}.", "F006", "uncertain"),
        ("Sin fracturas costales.", "F006", "absent"),
        ("Opacidades en vidrio deslustrado bilaterales.", "F005", "present"),
        ("Sin opacidades en vidrio deslustrado.", "F005", "absent"),
        ("Hernia de hiato.", "F027", "present"),
        ("Escoliosis dorsal.", "F011", "present"),
        ("Aumento del derrame pleural {L} en relación con estudio previo.", "F029", "present"),
        ("Probable atelectasia.", "F019", "present"),
    ],
}
_LATERAL = {"de": ["rechts", "links"], "fr": ["droit", "gauche"], "es": ["derecho", "izquierdo"]}
_LATERAL_ADJ = {"de": ["rechten", "linken"], "fr": ["droit", "gauche"], "es": ["derecho", "izquierdo"]}
_LOCALES = {"de": "de_DE", "fr": "fr_FR", "es": "es_ES"}
_MONTHS = {
    "de": [
        "Januar",
        "Februar",
        "März",
        "April",
        "Mai",
        "Juni",
        "Juli",
        "August",
        "September",
        "Oktober",
        "November",
        "Dezember",
    ],
    "fr": [
        "janvier",
        "février",
        "mars",
        "avril",
        "mai",
        "juin",
        "juillet",
        "août",
        "septembre",
        "octobre",
        "novembre",
        "décembre",
    ],
    "es": [
        "enero",
        "febrero",
        "marzo",
        "abril",
        "mayo",
        "junio",
        "julio",
        "agosto",
        "septiembre",
        "octubre",
        "noviembre",
        "diciembre",
    ],
}


def _date(lang: str, rng: random.Random, birth: bool = False) -> str:
    y = rng.randint(1925, 1990) if birth else rng.randint(2015, 2025)
    m, d = rng.randint(1, 12), rng.randint(1, 28)
    month = _MONTHS[lang][m - 1]
    forms = {
        "de": [f"{d:02d}.{m:02d}.{y}", f"{d}. {month} {y}", f"{d}.{m}.{y}", f"{d:02d}.{m:02d}.{y % 100:02d}"],
        "fr": [
            f"{d:02d}/{m:02d}/{y}",
            f"{d} {month} {y}",
            f"{'1er' if d == 1 else d} {month} {y}",
            f"{d:02d}.{m:02d}.{y}",
        ],
        "es": [f"{d:02d}/{m:02d}/{y}", f"{d} de {month} de {y}", f"{d:02d}-{m:02d}-{y}", f"{d}/{m}/{y}"],
    }[lang]
    return rng.choice(forms)


class _Doc:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.phi: list[dict] = []
        self.entities: list[dict] = []
        self.pos = 0

    def add(self, text: str, phi_type: str | None = None) -> None:
        if phi_type:
            self.phi.append({"start": self.pos, "end": self.pos + len(text), "type": phi_type, "value": text})
        self.parts.append(text)
        self.pos += len(text)

    def fill(self, template: str, values: dict[str, tuple[str, str]]) -> None:
        """``template`` with ``{KEY}`` slots; ``values[KEY] = (text, phi type)``."""
        import re

        last = 0
        for m in re.finditer(r"\{(\w+)\}", template):
            self.add(template[last : m.start()])
            text, kind = values[m.group(1)]
            self.add(text, kind)
            last = m.end()
        self.add(template[last:])


_TEMPLATES = {
    "de": {
        "head": [
            "{ORG}\nKlinik für Diagnostische und Interventionelle Radiologie\n{STREET}, {ZIP} {CITY}\nTel. {PHONE}\n\n",
            "{ORG}, {CITY}\nInstitut für Radiologie\n\n",
            "Radiologie {ORG}\n\n",
        ],
        "patient": [
            "Patient: {PNAME}, geb. {BIRTH}\nFallnummer: {ID}\n",
            "Patientin: Frau {PNAME}, geboren am {BIRTH}\nPatienten-ID: {ID}\n",
            "Name: {PNAME}\nGeb.-Datum: {BIRTH}\nFall-Nr.: {ID}\n",
            "Herr {PNAME} (* {BIRTH}), Pat.-Nr. {ID}\n",
        ],
        "exam": [
            "\nRöntgen Thorax in zwei Ebenen vom {DATE}\n",
            "\nUntersuchung: Röntgen Thorax p.a. vom {DATE}\n",
            "\nCT Thorax vom {DATE}\n",
        ],
        "indication": [
            "Fragestellung: Pneumonie? Überweisung durch Dr. med. {DNAME2}.\n",
            "Klinische Angaben: Dyspnoe, Fieber.\n",
        ],
        "comparison": ["Vergleich: Voraufnahme vom {DATE2}.\n", "Keine Voraufnahmen.\n"],
        "findings": "Befund:\n",
        "impression": "\nBeurteilung:\n",
        "sign": [
            "\nMit freundlichen Grüßen\nDr. med. {DNAME}\nOberarzt",
            "\nBefundet von: Dr. {DNAME}",
            "\ngez. Prof. Dr. med. {DNAME}",
        ],
    },
    "fr": {
        "head": [
            "{ORG}\nService d'Imagerie Médicale\n{STREET}, {ZIP} {CITY}\nTél. : {PHONE}\n\n",
            "{ORG} - {CITY}\nService de Radiologie\n\n",
            "Radiologie - {ORG}\n\n",
        ],
        "patient": [
            "Patiente : Mme {PNAME}, née le {BIRTH}\nN° de dossier : {ID}\n",
            "Patient : M. {PNAME}, né le {BIRTH}\nIPP : {ID}\n",
            "Nom : {PNAME}\nDate de naissance : {BIRTH}\nN° dossier : {ID}\n",
            "Monsieur {PNAME} (né le {BIRTH}) - IPP {ID}\n",
        ],
        "exam": [
            "\nRadiographie thoracique de face du {DATE}\n",
            "\nExamen : radiographie du thorax, le {DATE}\n",
            "\nScanner thoracique du {DATE}\n",
        ],
        "indication": [
            "Indication : suspicion de pneumopathie. Adressé par le Dr {DNAME2}.\n",
            "Indication : dyspnée, fièvre.\n",
        ],
        "comparison": ["Comparaison : examen du {DATE2}.\n", "Pas d'examen antérieur.\n"],
        "findings": "Résultats :\n",
        "impression": "\nConclusion :\n",
        "sign": ["\nCordialement,\nDr {DNAME}", "\nCompte rendu validé par le Pr {DNAME}", "\nDr {DNAME}, radiologue"],
    },
    "es": {
        "head": [
            "{ORG}\nServicio de Radiodiagnóstico\n{STREET}, {ZIP} {CITY}\nTel.: {PHONE}\n\n",
            "{ORG} ({CITY})\nServicio de Radiología\n\n",
            "Radiología - {ORG}\n\n",
        ],
        "patient": [
            "Paciente: {PNAME}, nacido el {BIRTH}\nNHC: {ID}\n",
            "Paciente: Sra. {PNAME}, fecha de nacimiento: {BIRTH}\nNº historia: {ID}\n",
            "Nombre: {PNAME}\nFecha de nacimiento: {BIRTH}\nNHC: {ID}\n",
            "D. {PNAME} (nacido el {BIRTH}), NHC {ID}\n",
        ],
        "exam": [
            "\nRadiografía de tórax PA y lateral del {DATE}\n",
            "\nExploración: radiografía de tórax, {DATE}\n",
            "\nTC de tórax del {DATE}\n",
        ],
        "indication": [
            "Motivo: sospecha de neumonía. Remitido por el Dr. {DNAME2}.\n",
            "Datos clínicos: disnea, fiebre.\n",
        ],
        "comparison": ["Comparación: estudio previo del {DATE2}.\n", "Sin estudios previos.\n"],
        "findings": "Hallazgos:\n",
        "impression": "\nConclusión:\n",
        "sign": ["\nAtentamente,\nDr. {DNAME}", "\nFdo.: Dra. {DNAME}", "\nInformado por: Dr. {DNAME}"],
    },
}


def _org(lang: str, fake, rng: random.Random, city: str) -> str:
    last = fake.last_name()
    return rng.choice(
        {
            "de": [
                f"Klinikum {city}",
                f"Universitätsklinikum {city}",
                f"St.-{fake.first_name()}-Krankenhaus",
                f"Kreisklinik {city}",
                f"Krankenhaus {city}-Nord",
                f"Praxis für Radiologie Dr. {last}",
            ],
            "fr": [
                f"CHU de {city}",
                f"Hôpital {fake.first_name()} {last}",
                f"Centre Hospitalier de {city}",
                f"Clinique Saint-{fake.first_name()}",
                f"Hôpital privé de {city}",
            ],
            "es": [
                f"Hospital Universitario {city}",
                f"Hospital General de {city}",
                f"Clínica {last}",
                f"Hospital Clínico San {fake.first_name()}",
                f"Complejo Hospitalario de {city}",
            ],
        }[lang]
    )


def generate(lang: str, n: int, seed: int = 0, names: tuple[list[str], list[str]] | None = None) -> list[dict]:
    """``n`` synthetic reports in ``lang`` (``de``, ``fr``, ``es``); the same ``seed`` gives the same reports.

    Parameters
    ----------
    names : (first names, last names), optional
        Draw person names only from these (held-out names; see the module docstring).

    Returns
    -------
    list of dict
        Documents in the layout of the module docstring; PHI types ``NAME``, ``DATE``, ``ID``, ``ORGANIZATION``,
        ``LOCATION``, ``ADDRESS``, ``PHONE``.
    """
    from faker import Faker

    fake = Faker(_LOCALES[lang])
    fake.seed_instance(seed)
    rng = random.Random(seed)
    tpl = _TEMPLATES[lang]
    docs = []

    def person() -> str:
        if names:
            first, last = names
            parts = [rng.choice(first), rng.choice(last)]
            if rng.random() < 0.3:
                parts.append(rng.choice(last))
            return " ".join(parts)
        return f"{fake.first_name()} {fake.last_name()}"

    for i in range(n):
        doc = _Doc()
        city = fake.city()
        values = {
            "ORG": (_org(lang, fake, rng, city), "ORGANIZATION"),
            "CITY": (city, "LOCATION"),
            "STREET": (fake.street_address().replace("\n", " "), "ADDRESS"),
            "ZIP": (fake.postcode(), "ADDRESS"),
            "PHONE": (fake.phone_number(), "PHONE"),
            "PNAME": (person(), "NAME"),
            "BIRTH": (_date(lang, rng, True), "DATE"),
            "ID": (str(rng.randint(10**5, 10**9)), "ID"),
            "DATE": (_date(lang, rng), "DATE"),
            "DATE2": (_date(lang, rng), "DATE"),
            "DNAME": (person().split(" ", 1)[-1] if rng.random() < 0.5 else person(), "NAME"),
            "DNAME2": (person().split(" ", 1)[-1], "NAME"),
        }
        for key in ("head", "patient", "exam", "indication", "comparison"):
            doc.fill(rng.choice(tpl[key]), values)
        doc.add(tpl["findings"])
        for j, (sentence, cid, assertion) in enumerate(rng.sample(FINDINGS[lang], 4)):
            side = rng.randrange(2)
            text = sentence.replace(
                "{L}", (_LATERAL_ADJ if "Unterlappen" in sentence or "Oberfeld" in sentence else _LATERAL)[lang][side]
            )
            if j:
                doc.add(" ")
            doc.entities.append(
                {"start": doc.pos, "end": doc.pos + len(text), "entity_id": cid, "assertion": assertion}
            )
            doc.add(text)
        doc.add(tpl["impression"])
        sentence, cid, assertion = rng.choice(FINDINGS[lang])
        text = sentence.replace("{L}", _LATERAL[lang][rng.randrange(2)])
        doc.entities.append({"start": doc.pos, "end": doc.pos + len(text), "entity_id": cid, "assertion": assertion})
        doc.add(text + "\n")
        doc.fill(rng.choice(tpl["sign"]), values)
        docs.append(
            {
                "id": f"synth-{lang}-{seed}-{i}",
                "language": lang,
                "text": "".join(doc.parts),
                "phi": doc.phi,
                "entities": doc.entities,
            }
        )
    return docs
