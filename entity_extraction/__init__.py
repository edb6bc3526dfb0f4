"""MedReCo-DB entity_extraction layer."""
