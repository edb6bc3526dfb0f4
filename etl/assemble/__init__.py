"""Assembling the dataset from curated rows: patient splits, longitudinal prior/current pairs, comparative VQA
items, entity-conditioned retrieval targets (pure functions over tables; no storage, no Airflow)."""
