"""MedReCo-DB etl layer."""
