"""Report files of the reports stage: one delivered file (CSV, JSONL, text, HL7 v2) -> de-identified ``reports`` rows,
its ledger event and its withheld records. Used by the build's reports stage and by ``medreco validate-source``.

Restricted input (the file and its records hold PHI); everything returned is PHI-free except the ``reports`` rows'
de-identified text, which has passed the de-identifier of its language (:func:`entity_extraction.languages.route.
deidentify_report`: English rules or a language pack; no pack: withheld ``unsupported_language``) and the
surviving-date check.
"""

from __future__ import annotations

import datetime as dt
import json

from etl.limits import MAX_REPORT_CHARS, REPORT_TIME_LIMIT_S, RecordLimitError, check_length, time_limit


def read_report_file(
    data: bytes, source_uri: str, sha256: str, inst, key, index, header_phi_of, shard_count: int, seen_ids: set[str]
) -> tuple[dict, list[dict], list[dict]]:
    """The reports stage on one report file: parse, link, de-identify every record; never raises.

    Parameters
    ----------
    data : bytes
        the file (restricted: PHI).
    source_uri, sha256 : str
        the file's plan row.
    inst, key, index, header_phi_of, shard_count
        as for :func:`report_record_row`.
    seen_ids : set of str
        report pseudonyms already read in this run (updated: a report delivered twice is read once).

    Returns
    -------
    tuple of (dict, list of dict, list of dict)
        the file's event (``status`` ``ingested`` or ``quarantined`` with ``reason`` and ``detail``; a file none
        of whose records can be read is quarantined with the first error's precise reason), its ``reports`` rows
        and its withheld records ``{"source_uri", "record", "reason", "detail"}`` (``record``: the source's
        report id, None for a record that could not be parsed).
    """
    from entity_extraction.languages.route import UnsupportedLanguageError
    from etl.sources.reports import ReportSourceError, iter_report_source, unreadable_file_detail

    event = {"source_uri": source_uri, "sha256": sha256, "stage": "reports"}
    try:
        items = list(iter_report_source(data, inst.report_format, source_uri.rsplit("/", 1)[-1]))
    except ReportSourceError as err:
        return {**event, "status": "quarantined", "reason": err.reason, "detail": str(err)[:300]}, [], []
    except Exception as err:  # noqa: BLE001  an unforeseen parse failure quarantines the file, not the task
        return (
            {
                **event,
                "status": "quarantined",
                "reason": "malformed_report_record",
                "detail": f"{type(err).__name__} while reading the report file",
            },
            [],
            [],
        )
    records = [r for r in items if not isinstance(r, ReportSourceError)]
    errors = [r for r in items if isinstance(r, ReportSourceError)]
    withheld = [
        {"source_uri": source_uri, "record": None, "reason": bad.reason, "detail": str(bad)[:300]} for bad in errors
    ]
    if items and not records:  # the precise reason of the file, not only of its records
        return (
            {
                **event,
                "status": "quarantined",
                "reason": "malformed_report_record",
                "detail": unreadable_file_detail(errors),
            },
            [],
            withheld,
        )
    rows = []
    for rec in records:
        report_id = key.pseudonym("report", f"{inst.id}|{rec['report_id']}")
        if report_id in seen_ids:
            continue  # the same report delivered twice in one file: first wins (deterministic order)
        seen_ids.add(report_id)
        held = {"source_uri": source_uri, "record": rec["report_id"]}
        try:  # one report's failure withholds that report (PHI-free record), never fails the task
            row = report_record_row(rec, inst, report_id, key, index, header_phi_of, shard_count)
        except RecordLimitError as err:
            withheld.append({**held, "reason": err.reason, "detail": str(err)})
            continue
        except UnsupportedLanguageError as err:  # fail closed: no language pack de-identifies this report
            withheld.append({**held, "reason": err.reason, "detail": err.detail})
            continue
        except Exception as err:  # noqa: BLE001  the exception's text may quote report text: type only
            withheld.append(
                {
                    **held,
                    "reason": "report_processing_error",
                    "detail": f"{type(err).__name__} while de-identifying the report",
                }
            )
            continue
        if row is None:
            # fail closed: the report is withheld and a PHI-free quarantine record names it
            withheld.append(
                {
                    **held,
                    "reason": "verification_failed",
                    "detail": "a date of the source text survived text de-identification",
                }
            )
            continue
        rows.append(row)
    return {**event, "status": "ingested"}, rows, withheld


def report_record_row(rec: dict, inst, report_id: str, key, index, header_phi_of, shard_count: int) -> dict | None:
    """The ``reports`` row of one report record: linked, de-identified, split into sections; None when a date of
    the source text survives de-identification (the caller withholds it).

    Parameters
    ----------
    rec : dict
        a record of :func:`etl.sources.reports.iter_report_source` (restricted: it holds PHI).
    inst : schemas.config.Institution
    report_id : str
        the record's report pseudonym.
    key : etl.keys.PseudonymKey
    index : etl.sources.report_linking.StudyIndex
        the run's de-identified studies.
    header_phi_of : callable(str) -> list of str
        the header PHI (:func:`etl.sources.report_linking.header_phi`) of a study's source file, by its URI.
    shard_count : int

    Raises
    ------
    etl.limits.RecordLimitError
        ``report_too_long`` for a text over :data:`etl.limits.MAX_REPORT_CHARS` (not processed at all),
        ``report_timeout`` when de-identifying it takes longer than :data:`etl.limits.REPORT_TIME_LIMIT_S`.
    entity_extraction.languages.route.UnsupportedLanguageError
        ``unsupported_language``: the report's detected language has no language pack.
    Exception
        anything else that fails (the caller withholds the report).
    """
    from entity_extraction.languages.route import deidentify_report, prepare_language, section_rules_path
    from entity_extraction.sections import split_sections
    from etl.sources.report_linking import link_report, parse_report_datetime, surviving_source_dates

    check_length(rec["text"], MAX_REPORT_CHARS, "report_too_long", "report text")
    link = link_report(rec, inst, key, index)
    patient_key = link.patient_key
    known_phi = [str(rec[k]) for k in ("patient_id", "patient_name", "accession_number") if rec.get(k)]
    uri = index.study_source.get(link.study_key) if link.study_key else None
    known_phi += header_phi_of(uri) if uri else []
    shift = key.date_shift_days(patient_key) if patient_key else None
    # the report's language decides its rules (a language without a pack raises UnsupportedLanguageError); identified
    # and its pack loaded before the time limit starts: loading happens once per process
    decided = prepare_language(rec["text"], rec.get("language") or inst.language)
    with time_limit(REPORT_TIME_LIMIT_S, "report_timeout", "report's de-identification"):
        language, text, counts = deidentify_report(
            rec["text"],
            prior=decided.language,
            known_phi=known_phi,
            date_shift_days=shift,
            day_first=inst.reads_day_first,
            decision=decided,
        )
        if surviving_source_dates(rec["text"], text):
            return None
        sections = split_sections(text, section_rules_path(language.language))
    rdate = parse_report_datetime(rec.get("report_datetime"))
    return {
        "report_id": report_id,
        "study_key": link.study_key,
        "patient_key": patient_key,
        "institution": inst.id,
        "language": language.language,
        "link_status": link.link_status,
        **{k: sections.get(k) or None for k in ("indication", "comparison", "findings", "impression")},
        "text": text,
        "redactions": int(sum(counts.values())),
        "redaction_counts": json.dumps(dict(sorted(counts.items()))),
        "report_date_shifted": (rdate + dt.timedelta(days=shift)) if (rdate and shift is not None) else None,
        "shard": key.shard(patient_key or report_id, shard_count),
    }
