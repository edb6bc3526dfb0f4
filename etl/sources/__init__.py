"""Reading deliveries: DICOM discovery and integrity (:mod:`etl.sources.discover`,
:mod:`etl.sources.dicom_integrity`) and report sources (:mod:`etl.sources.reports`: CSV, JSONL, text, HL7 v2)."""
