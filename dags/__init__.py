"""MedReCo-DB dags layer."""
