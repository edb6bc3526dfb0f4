"""Pixels: decoding de-identified DICOM (:mod:`etl.pixels.decode`), 2D normalisation to PNG and CT/MR volumes
(:mod:`etl.pixels.normalise`, :mod:`etl.pixels.volumes`), volume payloads (:mod:`etl.pixels.npy_payload`)."""
