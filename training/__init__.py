"""MedReCo-DB training layer."""
