"""MedReCo-DB quality layer."""
