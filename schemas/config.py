"""Pipeline configuration: one YAML file validated by pydantic models.

A bad configuration fails before any work starts with :class:`ConfigError`, whose message names
the offending field (dotted path, e.g. ``institutions.2.timezone``) and what is wrong with it.

The pseudonymisation secret is deliberately *not* part of this model: it comes from the
environment or an Airflow connection (see :mod:`etl.keys`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from schemas.errors import ReasonCodedError

#: the project's checkout (the folder holding ``etl/``, ``schemas/``, ``config/``): the one place it is computed
PROJECT_ROOT = Path(__file__).resolve().parents[1]
#: the project's config folder (demo config, VQA templates, retrieval similarity, training jobs)
CONFIG_DIR = PROJECT_ROOT / "config"
#: environment variable naming the config file of a deployment (else :data:`DEFAULT_CONFIG`)
CONFIG_ENV = "MEDRECO_CONFIG"
#: the embedded default's config
DEFAULT_CONFIG = CONFIG_DIR / "demo.yaml"


def default_config_path() -> str:
    """The config file a command uses when none is given: ``$MEDRECO_CONFIG``, else the checkout's
    ``config/demo.yaml`` (:data:`DEFAULT_CONFIG`)."""
    return os.environ.get(CONFIG_ENV) or str(DEFAULT_CONFIG)


#: Airflow's default ``[core] max_map_length``: a mapped task may not fan out wider than this.
AIRFLOW_MAX_MAP_LENGTH = 1024

#: ISO 3166-1 alpha-2 country code.
_COUNTRY_RE = re.compile(r"^[A-Z]{2}$")
#: BCP 47 primary language subtag (ISO 639-1), e.g. ``en``, ``de``.
_LANGUAGE_RE = re.compile(r"^[a-z]{2,3}$")
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{1,39}$")


class ConfigError(ReasonCodedError, ValueError):
    """Raised when a configuration file cannot be read or does not validate."""

    default_reason = "config_invalid"
    message_format = "{message}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Institution(_Strict):
    """One hospital that delivers DICOM studies and reports."""

    id: str = Field(description="short stable id, lowercase, e.g. 'us-bos-01'")
    name: str = ""
    country: str = Field(description="ISO 3166-1 alpha-2 code, e.g. 'US'")
    language: str = Field(description="language of its reports, ISO 639-1, e.g. 'en'")
    timezone: str = Field(description="IANA time zone of its DICOM timestamps, e.g. 'America/New_York'")
    source_uri: str = Field(
        description="folder or s3:// prefix holding its deliveries; relative = under storage root/sources"
    )
    report_format: Literal["jsonl", "csv", "text", "hl7", "none"] = "jsonl"
    patient_id_issuer: str | None = Field(
        default=None,
        description="IssuerOfPatientID of the institution's own MRNs (assumed where a file or report has none)",
    )
    report_glob: str | None = Field(
        default=None, description="file-name pattern of report files (default from report_format, e.g. '*.jsonl')"
    )
    dicom: bool = Field(default=True, description="False for a report-only source")
    day_first_dates: bool | None = Field(
        default=None, description="read 04/03/2023 in reports as 4 March; default: True outside the US"
    )
    report_family: str | None = Field(
        default=None, description="MedReCo family assumed for reports that link to no study (e.g. '2D-CXR')"
    )

    @property
    def reads_day_first(self) -> bool:
        """Whether numeric dates in this institution's reports are day-first."""
        return self.day_first_dates if self.day_first_dates is not None else self.country != "US"

    @field_validator("report_family")
    @classmethod
    def _family(cls, v: str | None) -> str | None:
        families = ("2D-CXR", "3D-CT", "3D-Brain-MRI", "2D-Ultrasound")
        if v is not None and v not in families:
            raise ValueError(f"must be one of {', '.join(families)}")
        return v

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID_RE.match(v):
            raise ValueError("must be 2-40 characters of a-z, 0-9, '-' or '_', starting with a letter or digit")
        return v

    @field_validator("country")
    @classmethod
    def _country(cls, v: str) -> str:
        if not _COUNTRY_RE.match(v):
            raise ValueError("must be an ISO 3166-1 alpha-2 code such as 'US' or 'DE'")
        return v

    @field_validator("language")
    @classmethod
    def _language(cls, v: str) -> str:
        if not _LANGUAGE_RE.match(v):
            raise ValueError("must be an ISO 639-1 code such as 'en' or 'de'")
        return v

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown IANA time zone {v!r}") from None
        return v


class StorageConfig(_Strict):
    """Where the zones live: a local folder or an ``s3://bucket/prefix``."""

    root: str = Field(description="local path (relative to the config file) or s3://bucket/prefix")
    s3_endpoint_url: str | None = Field(default=None, description="for S3-compatible stores; else AWS_ENDPOINT_URL")
    s3_region: str = "us-east-1"


class NormalisationConfig(_Strict):
    """Pixel normalisation settings (deepened by the normalisation issue)."""

    image_size: tuple[int, int] = Field(default=(480, 480), description="2D output rows x cols, pixels")
    png_bit_depth: Literal[8, 16] = 8
    keep_aspect: bool = True
    ct_hu_window: tuple[float, float] = Field(default=(-1000.0, 1000.0), description="HU clip for CT volumes")
    ct_spacing_mm: tuple[float, float, float] | None = Field(
        default=(0.75, 0.75, 1.5),
        description="CT volumes resampled to [row, col, slice] mm (MedReCo); null keeps native",
    )
    volume_max_voxels: int = Field(default=64_000_000, gt=0)
    nifti_gzip_level: int = Field(
        default=1, ge=1, le=9, description="gzip level of the curated/volumes/<sha256>.nii.gz objects (1: fast)"
    )
    irregular_slices: Literal["resample", "quarantine"] = Field(
        default="resample",
        description="series with missing slices, non-uniform spacing or gantry tilt: interpolate onto a regular grid, "
        "or quarantine (irregular_slice_geometry)",
    )

    @field_validator("image_size")
    @classmethod
    def _size(cls, v: tuple[int, int]) -> tuple[int, int]:
        if min(v) < 16 or max(v) > 4096:
            raise ValueError("each side must be between 16 and 4096 pixels")
        return v


class BatchConfig(_Strict):
    """Tensor shapes the torch Datasets of a release return (``medreco_reader.torch_data``): fixed, so PyTorch's
    default collate stacks any batch."""

    channels: Literal[1, 3] = Field(default=1, description="2D image channels: 1 (RGB averaged) or 3 (grey repeated)")
    image_size: tuple[int, int] | None = Field(
        default=None,
        description="2D rows x cols, pixels (aspect kept by resizing and zero padding); null: normalisation.image_size",
    )
    volume_shape: tuple[int, int, int] = Field(
        default=(240, 480, 480),
        description="volumes slices x rows x cols, voxels: centre crop / pad (MedReCo 480 x 480 x 240)",
    )

    @field_validator("volume_shape")
    @classmethod
    def _volume(cls, v: tuple[int, int, int]) -> tuple[int, int, int]:
        if min(v) < 1 or max(v) > 4096:
            raise ValueError("each side must be between 1 and 4096 voxels")
        return v


class PairingConfig(_Strict):
    """Longitudinal prior/current pairing."""

    min_gap_days: int = Field(default=1, ge=0)
    max_gap_days: int = Field(default=3 * 365, gt=0)
    frontal_only_cxr: bool = True
    all_priors: bool = False
    max_priors: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _window(self) -> PairingConfig:
        if self.max_gap_days < self.min_gap_days:
            raise ValueError("max_gap_days must not be smaller than min_gap_days")
        return self


class VQAConfig(_Strict):
    """Comparative VQA item generation."""

    templates: str = Field(default="vqa_templates.yaml", description="template file name under config/")
    max_items_per_pair: int = Field(default=8, ge=1)
    n_options: int = Field(default=4, ge=2, le=6)


class SplitConfig(_Strict):
    """Patient-level split fractions and institution-held-out external test."""

    train: float = Field(default=0.8, gt=0, lt=1)
    val: float = Field(default=0.1, ge=0, lt=1)
    test: float = Field(default=0.1, ge=0, lt=1)
    external_test_institutions: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _sum(self) -> SplitConfig:
        if abs(self.train + self.val + self.test - 1.0) > 1e-9:
            raise ValueError(f"train + val + test must be 1.0, got {self.train + self.val + self.test:g}")
        return self


class RetrievalConfig(_Strict):
    """Entity-conditioned reference-case retrieval targets (``etl.assemble.retrieval``).

    Defaults after MedReCo: a candidate is relevant to a query when its per-entity similarity exceeds 0.9,
    and at most 30,000 studies per (family, entity) take part.
    """

    threshold: float = Field(default=0.9, ge=0, lt=1, description="relevance must exceed this (MedReCo: 0.9)")
    top_k: int = Field(default=10, ge=1, le=1000, description="neighbours kept per (query study, entity)")
    max_studies_per_entity: int = Field(
        default=30_000, ge=2, description="cap on studies per (family, entity), lowest hash first (MedReCo: 30,000)"
    )
    states: list[Literal["present", "absent", "uncertain"]] = Field(
        default=["present"],
        min_length=1,
        description="entity states whose studies are queries and candidates (not_mentioned never is)",
    )
    weights: dict[Literal["laterality", "severity", "anatomy", "change"], float] = Field(
        default={"laterality": 0.3, "severity": 0.3, "anatomy": 0.2, "change": 0.2},
        description="attribute weights of the similarity (summing to 1); the assertion must match exactly",
    )
    similarity: str = Field(
        default="retrieval_similarity.yaml", description="attribute distance tables (data file under config/)"
    )

    @model_validator(mode="after")
    def _weights(self) -> RetrievalConfig:
        if set(self.weights) != {"laterality", "severity", "anatomy", "change"}:
            raise ValueError("weights needs exactly laterality, severity, anatomy and change")
        if any(w < 0 for w in self.weights.values()) or abs(sum(self.weights.values()) - 1.0) > 1e-9:
            raise ValueError(f"weights must be >= 0 and sum to 1.0, got {sum(self.weights.values()):g}")
        return self


class PixelCleaningRule(_Strict):
    """Blank known burned-in text regions of one device's images (CTP DicomPixelAnonymizer style).

    A rule applies when Manufacturer and ManufacturerModelName match (case-insensitive regular
    expressions, whole value) and, when given, Rows and Columns equal the image's.
    """

    manufacturer: str
    model: str = ".*"
    rows: int | None = None
    columns: int | None = None
    regions: list[tuple[int, int, int, int]] = Field(
        min_length=1, description="[x0, y0, x1, y1] pixel boxes (columns x, rows y; x1/y1 exclusive) to blank"
    )

    @field_validator("manufacturer", "model")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as err:
            raise ValueError(f"not a valid regular expression: {err}") from None
        return v

    @field_validator("regions")
    @classmethod
    def _boxes(cls, v: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
        for x0, y0, x1, y1 in v:
            if min(x0, y0) < 0 or x1 <= x0 or y1 <= y0:
                raise ValueError(f"region {[x0, y0, x1, y1]} must have 0 <= x0 < x1 and 0 <= y0 < y1")
        return v


class OcrOffRule(_Strict):
    """Where a curator has checked the archive for burned-in text: OCR is not run on these files.

    ``institution`` is an institution id and ``modality`` a DICOM Modality code; ``"*"`` matches any.
    """

    institution: str = "*"
    modality: str = "*"


class BurnedInTextConfig(_Strict):
    """Burned-in text found by OCR in the pixels of every image (policy: ``schemas/deid/burned_in_text.yaml``)."""

    ocr: bool = Field(default=True, description="read every 2D image and frame with Tesseract OCR; blank text")
    ocr_off: list[OcrOffRule] = Field(
        default_factory=list,
        description="institution/modality pairs checked by a curator: OCR off there (header rules still apply)",
    )

    def enabled(self, institution: str, modality: str) -> bool:
        """Whether OCR runs for a file of ``institution`` with ``modality``."""
        if not self.ocr:
            return False
        m = modality.strip().upper()
        return not any(
            r.institution in ("*", institution) and r.modality.strip().upper() in ("*", m) for r in self.ocr_off
        )


class DeidConfig(_Strict):
    """PS3.15 options (recorded in DeidentificationMethodCodeSequence, CID 7050) and burned-in text rules."""

    retain_longitudinal_modified_dates: bool = Field(default=True, description="113107: shift dates per patient")
    retain_patient_characteristics: bool = Field(default=True, description="113108: sex, size, weight, age<=89")
    clean_descriptors: bool = Field(
        default=True, description="113105: keep Study/Series description, protocol, scrubbed"
    )
    retain_device_identity: bool = Field(default=False, description="113109: keep station name, serial numbers")
    retain_safe_private: bool = Field(default=False, description="113111: keep allow-listed private attributes")
    safe_private_allowlist: str | None = Field(
        default=None,
        description="CSV (private_creator, element) kept under 113111; default: the TCIA-derived schemas/deid list",
    )
    pixel_cleaning: list[PixelCleaningRule] = Field(default_factory=list)
    burned_in_text: BurnedInTextConfig = BurnedInTextConfig()
    deface: Literal["on", "quarantine", "off"] = Field(
        default="on",
        description="113102 for head CT/MR volumes: on = remove the face (else quarantine defacing_failed), "
        "quarantine = withhold head volumes, off = keep faces (only where the data agreement allows; the release "
        "card says so)",
    )
    recognizable_visual_features_allowed: list[str] = Field(
        default_factory=list,
        description="institution ids whose data agreement allows images showing a face (VL/Video Photographic "
        "SOP classes, RecognizableVisualFeatures YES); elsewhere they are quarantined recognizable_visual_features",
    )


class TrainingConfig(_Strict):
    """How training is launched on each published snapshot."""

    launcher: Literal["local", "kubernetes", "sagemaker", "none"] = "local"
    image: str | None = Field(default=None, description="container image for kubernetes/cloud launchers")
    namespace: str = "medreco"
    gpus: int = Field(default=0, ge=0)
    encoder_config: str = Field(
        default="config/training/encoder-tiny-cpu.yaml",
        description="job config: relative to this file's folder, else the project root",
    )
    vlm_config: str = Field(
        default="config/training/vlm-tiny-cpu.yaml",
        description="job config: relative to this file's folder, else the project root",
    )


class PipelineConfig(_Strict):
    """The whole MedReCo-DB build configuration (one YAML file)."""

    name: str = "medreco-db"
    storage: StorageConfig
    institutions: list[Institution] = Field(min_length=1)
    shard_count: int = Field(default=8, ge=1, le=65536, description="patient-hash shards")
    max_map_length: int = Field(default=AIRFLOW_MAX_MAP_LENGTH, ge=1, description="cap on mapped task width")
    normalisation: NormalisationConfig = NormalisationConfig()
    pairing: PairingConfig = PairingConfig()
    vqa: VQAConfig = VQAConfig()
    splits: SplitConfig = SplitConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    deid: DeidConfig = DeidConfig()
    training: TrainingConfig = TrainingConfig()
    batches: BatchConfig = BatchConfig()
    #: where relative paths in this file are resolved from; set by :func:`load_config`
    base_dir: str = Field(default=".", exclude=True)

    @model_validator(mode="after")
    def _cross(self) -> PipelineConfig:
        ids = [i.id for i in self.institutions]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"institution ids must be unique, repeated: {', '.join(dup)}")
        unknown = sorted(set(self.splits.external_test_institutions) - set(ids))
        if unknown:
            raise ValueError(f"splits.external_test_institutions names unknown institutions: {', '.join(unknown)}")
        return self

    def institution(self, institution_id: str) -> Institution:
        """Return the institution with this id; raises KeyError if there is none."""
        for inst in self.institutions:
            if inst.id == institution_id:
                return inst
        raise KeyError(institution_id)

    def config_hash(self) -> str:
        """sha256 (hex) of the canonical JSON of this configuration, without ``base_dir`` and ``storage``.

        Where the zones are stored (a local folder or an ``s3://`` bucket, its endpoint and region) does not
        change what is built, so the same data built on either gets the same hash and snapshot content hash.
        """
        payload = json.dumps(self.model_dump(mode="json", exclude={"storage"}), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``X``, ``X | None``, ``list[X]``, ``dict[str, X]``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if (model := _model_in(arg)) is not None:
            return model
    return None


def _known_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the model a pydantic error location ``loc`` ends in (for "did you mean")."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        sub = _model_in(field.annotation) if field is not None else None
        if sub is None:
            break
        model = sub
    return list(model.model_fields)


def _format_errors(err: ValidationError, source: str) -> str:
    import difflib

    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            near = difflib.get_close_matches(str(e["loc"][-1]), _known_fields(PipelineConfig, tuple(e["loc"])), n=1)
            msg = f"unknown field (did you mean `{near[0]}`?)" if near else "unknown field (check spelling)"
        lines.append(f"{loc}: {msg}")
    return f"invalid configuration {source}: " + "; ".join(lines)


def parse_config(data: dict, *, base_dir: str | Path = ".", source: str = "<dict>") -> PipelineConfig:
    """Validate a configuration mapping.

    Raises
    ------
    ConfigError
        naming each offending field as a dotted path and what is wrong.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"invalid configuration {source}: top level must be a mapping, got {type(data).__name__}")
    if "pseudonym_key" in data or "secret" in data:
        raise ConfigError(
            f"invalid configuration {source}: the pseudonymisation secret must not be in the config file; "
            "set MEDRECO_PSEUDONYM_KEY or the Airflow connection 'medreco_pseudonym'"
        )
    try:
        return PipelineConfig.model_validate({**data, "base_dir": str(base_dir)})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a YAML configuration file.

    Relative paths inside it (storage root, source URIs) are resolved from the file's folder.

    Raises
    ------
    ConfigError
        when the file is missing, is not YAML, or does not validate.
    """
    p = Path(path)
    return parse_config(_read_yaml(p), base_dir=p.resolve().parent, source=str(p))


def _read_yaml(p: Path) -> Any:
    if not p.is_file():
        raise ConfigError(f"configuration file not found: {p}")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"configuration file {p} is not valid YAML: {err}") from None


def storage_config(path: str | Path) -> StorageConfig:
    """The ``storage:`` section of a config file, alone: what reading releases needs (``medreco snapshot list``,
    ``show``, ``verify``, ``diff``), so a file holding only ``storage: {root: ...}`` is enough. A relative local
    root is resolved by the caller from the file's folder.

    Raises
    ------
    ConfigError
        when the file is missing, is not YAML, or has no valid ``storage:`` section.
    """
    p = Path(path)
    data = _read_yaml(p)
    section = data.get("storage") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise ConfigError(f"configuration file {p} has no storage: section (storage: {{root: FOLDER or s3://...}})")
    try:
        return StorageConfig.model_validate(section)
    except ValidationError as err:
        problems = "; ".join(f"storage.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"configuration file {p}: {problems}") from None
