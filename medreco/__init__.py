"""MedReCo-DB builder, the application layer: the ``medreco`` command line (:mod:`medreco.cli`).

The top of the layers (README "Layout"): it imports ``etl``, ``dags``, ``quality``, ``training`` and
``entity_extraction``; nothing imports it.
"""
