"""Compound actions of PS3.15 Table E.1-1 resolved by the attribute's Type in the IOD (issue 22, item 1)."""

from __future__ import annotations

import pytest
from pydicom.datadict import tag_for_keyword

from etl.deid.policy import build_policy
from etl.deid.types import action_for_type, load_iod_types

CT = "1.2.840.10008.5.1.4.1.1.2"
ENHANCED_MR = "1.2.840.10008.5.1.4.1.1.4.1"
DX = "1.2.840.10008.5.1.4.1.1.1.1"
SEG = "1.2.840.10008.5.1.4.1.1.66.4"
BASIC_TEXT_SR = "1.2.840.10008.5.1.4.1.1.88.11"
KOS = "1.2.840.10008.5.1.4.1.1.88.59"
PET = "1.2.840.10008.5.1.4.1.1.128"
RTSTRUCT = "1.2.840.10008.5.1.4.1.1.481.3"


@pytest.mark.parametrize(
    "compound, t, expected",
    [
        ("X/Z", "3", "X"),
        ("X/Z", "2", "Z"),
        ("X/Z", "1", "untyped"),
        ("X/Z/D", "1C", "D"),
        ("X/Z/D", "2C", "Z"),
        ("X/D", "2", "D"),
        ("Z/D", "3", "Z"),
        ("Z/D", "1", "D"),
        ("X/Z/U*", "1", "U*"),
        ("X/Z/U*", "3", "X"),
        ("X", "2C", "Z"),
        ("X", "1", "X"),
        ("X", "3", "X"),
        ("D", "3", "D"),
        ("X/Z/D", None, "untyped"),
    ],
)
def test_action_for_type(compound, t, expected):
    assert action_for_type(compound, t, "untyped") == expected


@pytest.mark.parametrize(
    "sop, keyword, expected",
    [
        (CT, "ReferencedStudySequence", "X"),  # General Study, Type 3: removed, not emptied
        (CT, "ReferencedPerformedProcedureStepSequence", "X"),  # General Series, Type 3
        (DX, "ReferencedPerformedProcedureStepSequence", "D"),  # DX Series, Type 1C: kept, items de-identified
        (ENHANCED_MR, "ReferencedPerformedProcedureStepSequence", "D"),  # Enhanced Series, Type 1C
        (BASIC_TEXT_SR, "ReferencedPerformedProcedureStepSequence", "Z"),  # SR Document Series, Type 2
        (KOS, "ReferencedPerformedProcedureStepSequence", "Z"),
        (CT, "DeviceSerialNumber", "X"),  # General Equipment, Type 3
        (SEG, "DeviceSerialNumber", "D"),  # Enhanced General Equipment, Type 1
        (ENHANCED_MR, "DeviceSerialNumber", "D"),
        (CT, "StationName", "X"),
        (CT, "OperatorsName", "X"),
        (RTSTRUCT, "OperatorsName", "Z"),  # RT Series, Type 2
        (CT, "ResponsiblePerson", "Z"),  # Patient, Type 2C: zero length, not removed
        (CT, "ResponsibleOrganization", "Z"),
        (CT, "AcquisitionContextSequence", "Z"),  # Acquisition Context, Type 2
    ],
)
def test_top_level_actions_by_iod(sop, keyword, expected):
    policy = build_policy()
    assert policy.top_level_actions(sop)[tag_for_keyword(keyword)] == expected


def test_types_with_the_modified_dates_option_off():
    from schemas.config import DeidConfig

    policy = build_policy(DeidConfig(retain_longitudinal_modified_dates=False))
    date, content_date = tag_for_keyword("SeriesDate"), tag_for_keyword("ContentDate")
    assert policy.top_level_actions(PET)[date] == "D"  # PET Series: Series Date Type 1
    assert policy.top_level_actions(CT)[date] == "X"  # General Series: Type 3
    assert policy.top_level_actions(ENHANCED_MR)[content_date] == "D"  # Multi-frame Functional Groups: Type 1
    assert policy.top_level_actions(CT)[content_date] == "Z"  # General Image: Type 2C
    assert policy.top_level_actions(CT)[tag_for_keyword("InstanceCreationTime")] == "X"  # SOP Common, Type 3
    assert policy.actions[date] == "D"  # nested / untyped: profile.yaml compound


def test_prefix_entries_and_default():
    types = load_iod_types()
    assert types.types_for(BASIC_TEXT_SR) is types.types_for("1.2.840.10008.5.1.4.1.1.88.22")
    assert types.types_for(KOS) is not types.types_for(BASIC_TEXT_SR)
    assert types.types_for("1.2.3.4") is types.default
    assert types.type_of(CT, "ReferencedStudySequence") == "3"
    assert types.type_of(SEG, "DeviceSerialNumber") == "1"


def test_content_sequence_is_removed_by_the_profile():
    assert build_policy().action_for(tag_for_keyword("ContentSequence")) == "X"
