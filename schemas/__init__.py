"""MedReCo-DB schemas layer."""
