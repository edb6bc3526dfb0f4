"""De-identification of what leaves the source zone: DICOM PS3.15 Annex E (:mod:`etl.deid.dicom`) under the
deployment's policy (:mod:`etl.deid.policy`: Table E.1-1 resolved with the configured options)."""
