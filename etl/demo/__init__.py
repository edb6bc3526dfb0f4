"""The demo corpus (DICOM from public test files, reports, planted PHI with its answer key): off the product path."""
