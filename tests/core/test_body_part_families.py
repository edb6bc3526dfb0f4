"""Body part -> modality family map, as data (schemas/ontology/body_part_families.yaml; issue 22, item 5)."""

from __future__ import annotations

import pytest

from schemas.ontology import infer_body_part, modality_family


@pytest.mark.parametrize(
    "modality, body_part, family",
    [
        ("CT", "CHEST_TO_PELVIS", "3D-CT"),  # chest-abdomen-pelvis CT (COVID-19 follow-up): the chest family
        ("CT", "CHESTABDPELVIS", "3D-CT"),  # PS3.16 Annex L term
        ("CT", "CHESTABDOMEN", "3D-CT"),
        ("CT", "NECKCHESTABDPELV", "3D-CT"),
        ("CT", "chest abdomen pelvis", "3D-CT"),
        ("CT", "Chest-Abdomen", "3D-CT"),
        ("CT", "THORAX", "3D-CT"),
        ("CT", "LUNG", "3D-CT"),
        ("CT", "CHEST", "3D-CT"),
        ("CT", "ABDOMENPELVIS", None),
        ("CT", "ABDOMEN", None),
        ("CT", "WHOLEBODY", None),
        ("CT", "BREAST", None),
        ("CT", "HEAD", None),
        ("CT", None, None),
        ("CR", "CHEST", "2D-CXR"),
        ("DX", "THORAX", "2D-CXR"),
        ("DX", "", "2D-CXR"),
        ("CR", None, "2D-CXR"),
        ("DX", "CHEST_TO_PELVIS", "2D-CXR"),
        ("CR", "KNEE", None),
        ("MR", "BRAIN", "3D-Brain-MRI"),
        ("MR", "HEAD", "3D-Brain-MRI"),
        ("MR", "HEADNECK", "3D-Brain-MRI"),
        ("mr", "brain", "3D-Brain-MRI"),
        ("MR", "CHEST", None),
        ("MR", "", None),
        ("US", None, "2D-Ultrasound"),
        ("US", "ABDOMEN", "2D-Ultrasound"),
        ("MG", "BREAST", None),
        ("PT", "CHEST", None),
        (None, "CHEST", None),
    ],
)
def test_modality_family(modality, body_part, family):
    assert modality_family(modality, body_part) == family


def test_chest_abdomen_pelvis_descriptors_give_the_chest_family():
    # BodyPartExamined empty, descriptors name chest and pelvis: the inferred code is CHEST
    bp = infer_body_part("", ["CT CHEST ABDOMEN PELVIS WITH IV CONT", "", ""])
    assert (bp, modality_family("CT", bp)) == ("CHEST", "3D-CT")
    bp = infer_body_part("", ["CT ABD AND PELVIS WO IV CONT", "", ""])
    assert (bp, modality_family("CT", bp)) == ("ABDOMEN", None)
