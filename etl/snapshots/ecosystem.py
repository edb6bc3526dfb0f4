"""What the field's tools read in a release folder, written beside the manifest at publish:

- ``README.md``: a Hugging Face dataset card, YAML ``configs:`` with one config per table (its pinned Parquet
  files, relative to the release folder) and per view, and ``dataset_info`` features (``payload`` of ``images``
  an ``Image`` feature: the 2D PNG bytes; null for volume rows), so ``datasets.load_dataset(<release folder>,
  "pairs")`` reads the release's rows and no other release's; the body is the dataset card
  (:func:`etl.snapshots.card.dataset_card`) and the one-liners of :data:`READ_ME`;
- ``croissant.json``: a Croissant 1.0 JSON-LD description (MLCommons; context as data in
  ``croissant_context.json``): one ``FileObject`` per pinned file (sha256), one ``FileSet`` and ``RecordSet`` per
  table and view, a field per column;
- ``files/<table>.txt``: the pinned files of each table, one path a line relative to the release folder (DuckDB
  and polars read them with one call, README "Snapshots for ML users");
- ``views/pair_images.parquet`` and ``views/vqa_images.parquet``: pairs and VQA items resolved to their image rows
  (the representative image per study, modality and view: :func:`medreco_reader.images.pair_images`,
  :func:`medreco_reader.images.vqa_images`).

All of it is a deterministic function of the manifest and the tables (same release, same bytes); the manifest
records each file's sha256 (``release_files``) and :func:`etl.snapshots.verify` re-checks them.
"""

from __future__ import annotations

import io
import json
import posixpath
from importlib import resources
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

#: name, in the release folder, of the Hugging Face dataset card, the Croissant file and the file-list folder
HF_CARD = "README.md"
CROISSANT = "croissant.json"
FILE_LISTS = "files"
VIEWS = "views"
#: the one Hugging Face split of every config (the patient-level split is a column: ``splits.split``, ``vqa.split``)
HF_SPLIT = "full"
#: columns read to build the views
VIEW_INPUTS = {
    "images": ["image_key", "study_key", "kind", "modality", "view"],
    "pairs": ["pair_id", "patient_key", "prior_study_key", "current_study_key", "modality", "view"],
    "vqa": ["item_id", "pair_id", "study_key", "study_keys"],
}
VIEW_SCHEMAS = {
    "pair_images": pa.schema(
        [
            (c, pa.string())
            for c in (
                "pair_id",
                "patient_key",
                "modality",
                "view",
                "prior_study_key",
                "current_study_key",
                "prior_image_key",
                "current_image_key",
            )
        ],
        metadata={b"medreco.key": b"pair_id"},
    ),
    "vqa_images": pa.schema(
        [
            ("item_id", pa.string()),
            ("pair_id", pa.string()),
            ("study_keys", pa.list_(pa.string())),
            ("image_keys", pa.list_(pa.string())),
        ],
        metadata={b"medreco.key": b"item_id"},
    ),
}
#: image columns per table: PNG bytes (2D rows; null for volumes, which are NIfTI objects at ``payload_uri``)
IMAGE_COLUMNS = {"images": ("payload",)}


def _pick(wanted: pl.DataFrame, images: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """The representative ``image_key`` per row of ``wanted`` (columns ``by`` + ``study_key``, ``want_modality``,
    ``want_view``): :func:`medreco_reader.images.representative` vectorised. Its sequential filters with fallback
    (modality, then view, each dropped when nothing matches) are the lexicographic minimum of (modality mismatch,
    view mismatch, not 2D, image_key); ``tests/snapshots/test_ecosystem.py`` checks both agree."""
    joined = wanted.join(images, on="study_key", how="left")
    ranked = joined.with_columns(
        (
            pl.col("want_modality").is_not_null()
            & (pl.col("modality").is_null() | (pl.col("modality") != pl.col("want_modality")))
        ).alias("_m"),
        (
            pl.col("want_view").is_not_null() & (pl.col("view").is_null() | (pl.col("view") != pl.col("want_view")))
        ).alias("_v"),
        (pl.col("kind") != "2d").fill_null(True).alias("_k"),
    )
    return (
        ranked.group_by(by)
        .agg(pl.col("image_key").sort_by(["_m", "_v", "_k", "image_key"], nulls_last=True).first())
        .sort(by)
    )


def build_views(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    """The views of a release from its ``images``, ``pairs`` and ``vqa`` columns (:data:`VIEW_INPUTS`), with the
    rule of :func:`medreco_reader.images.pair_images` / :func:`~medreco_reader.images.vqa_images`, vectorised
    (polars joins: metadata columns only, linear in the rows).

    Returns
    -------
    dict
        ``pair_images`` (sorted by ``pair_id``) and ``vqa_images`` (sorted by ``item_id``), schemas
        :data:`VIEW_SCHEMAS`.
    """

    def get(name: str) -> pl.DataFrame:
        table = tables.get(name)
        cols = [c for c in VIEW_INPUTS[name] if table is not None and c in table.column_names]
        if table is None or not table.num_rows:
            return pl.DataFrame(
                {
                    c: pl.Series([], dtype=pl.List(pl.String) if c == "study_keys" else pl.String)
                    for c in VIEW_INPUTS[name]
                }
            )
        frame = pl.from_arrow(table.select(cols))
        assert isinstance(frame, pl.DataFrame)
        return (
            frame
            if "study_keys" in frame.columns or name != "vqa"
            else frame.with_columns(pl.lit(None, dtype=pl.List(pl.String)).alias("study_keys"))
        )

    images = get("images").select("image_key", "study_key", "kind", "modality", "view")
    pairs = get("pairs").sort("pair_id")
    sides = pl.concat(
        [
            pairs.select(
                "pair_id",
                pl.lit(side).alias("side"),
                pl.col(f"{side}_study_key").alias("study_key"),
                pl.col("modality").alias("want_modality"),
                pl.col("view").alias("want_view"),
            )
            for side in ("prior", "current")
        ]
    )
    picked = _pick(sides, images, ["pair_id", "side"])
    pair_view = pairs.join(
        picked.filter(pl.col("side") == "prior").select("pair_id", prior_image_key="image_key"),
        on="pair_id",
        how="left",
    )
    pair_view = pair_view.join(
        picked.filter(pl.col("side") == "current").select("pair_id", current_image_key="image_key"),
        on="pair_id",
        how="left",
    )
    pair_table = pair_view.select(VIEW_SCHEMAS["pair_images"].names).to_arrow().cast(VIEW_SCHEMAS["pair_images"])

    vqa = get("vqa").sort("item_id")
    p = pairs.select("pair_id", "prior_study_key", "current_study_key", "modality", "view")
    items = vqa.join(p, on="pair_id", how="left").with_columns(
        pl.when(pl.col("study_keys").list.len() > 0)
        .then(pl.col("study_keys"))
        .when(pl.col("prior_study_key").is_not_null())
        .then(pl.concat_list("prior_study_key", "current_study_key"))
        .when(pl.col("study_key").is_not_null())
        .then(pl.concat_list("study_key"))
        .otherwise(pl.lit([], dtype=pl.List(pl.String)))
        .alias("studies"),
        pl.col("modality").alias("want_modality"),
        pl.col("view").alias("want_view"),
    )
    wanted = (
        items.select("item_id", "studies", "want_modality", "want_view")
        .with_columns(pl.int_ranges(0, pl.col("studies").list.len()).alias("pos"))
        .explode(["studies", "pos"])
        .drop_nulls("pos")
        .rename({"studies": "study_key"})
    )
    per_study = _pick(wanted, images, ["item_id", "pos"]).sort(["item_id", "pos"])
    keys = per_study.group_by("item_id", maintain_order=True).agg(pl.col("image_key").alias("image_keys"))
    vqa_view = (
        items.select("item_id", "pair_id", pl.col("studies").alias("study_keys"))
        .join(keys, on="item_id", how="left")
        .with_columns(pl.col("image_keys").fill_null(pl.lit([], dtype=pl.List(pl.String))))
    )
    vqa_table = vqa_view.select(VIEW_SCHEMAS["vqa_images"].names).to_arrow().cast(VIEW_SCHEMAS["vqa_images"])
    return {"pair_images": pair_table, "vqa_images": vqa_table}


def parquet_bytes(table: pa.Table) -> bytes:
    """A view as Parquet bytes, fixed options (zstd, no statistics time): the same table gives the same bytes."""
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=True)
    return buf.getvalue()


def _relative(manifest: dict, table: str) -> list[str]:
    base = f"snapshots/{manifest['version']}"
    v = manifest["tables"][table]
    return [posixpath.relpath(f"{v['uri']}/{f['path']}", base) for f in v["files"]]


def hf_feature(name: str, typ: pa.DataType, image: bool = False) -> dict[str, Any]:
    """One column as a Hugging Face ``dataset_info.features`` YAML entry (``datasets.Features._to_yaml_list``).

    Raises
    ------
    ValueError
        for an Arrow type without a mapping here.
    """
    return {"name": name, **_hf_type(typ, image)}


def _hf_type(typ: pa.DataType, image: bool = False) -> dict[str, Any]:
    if image:
        return {"dtype": "image"}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        inner = typ.value_type
        if pa.types.is_struct(inner):
            return {"list": [hf_feature(inner.field(i).name, inner.field(i).type) for i in range(inner.num_fields)]}
        return {"list": _hf_type(inner)["dtype"]} if "dtype" in _hf_type(inner) else {"list": _hf_type(inner)}
    if pa.types.is_struct(typ):
        return {"struct": [hf_feature(typ.field(i).name, typ.field(i).type) for i in range(typ.num_fields)]}
    names = {
        pa.string(): "string",
        pa.large_string(): "large_string",
        pa.int8(): "int8",
        pa.int16(): "int16",
        pa.int32(): "int32",
        pa.int64(): "int64",
        pa.float32(): "float32",
        pa.float64(): "float64",
        pa.bool_(): "bool",
        pa.binary(): "binary",
        pa.large_binary(): "large_binary",
        pa.date32(): "date32",
    }
    if typ in names:
        return {"dtype": names[typ]}
    if pa.types.is_timestamp(typ):
        return {"dtype": f"timestamp[{typ.unit}" + (f", tz={typ.tz}" if typ.tz else "") + "]"}
    raise ValueError(f"no Hugging Face feature for Arrow type {typ}")


READ_ME = """## Reading this release without the project

Paths below are relative to this folder (`snapshots/{version}/`); `R` is its path.

| tool | one line |
|---|---|
| Hugging Face `datasets` | `datasets.load_dataset(R, "pairs", split="{split}")` \
(configs: every table, `pair_images`, `vqa_images`; \
`images.payload` is an `Image` feature: 2D PNG, null for volumes) |
| DuckDB | `duckdb.read_parquet([f"{{R}}/{{p}}" for p in open(f"{{R}}/files/pairs.txt").read().split()])` |
| polars | `pl.scan_parquet([f"{{R}}/{{p}}" for p in open(f"{{R}}/files/pairs.txt").read().split()])` |
| Croissant (`mlcroissant`) | `mlcroissant.Dataset(f"{{R}}/croissant.json").records("pairs")` |
| medreco-reader | `medreco_reader.load_snapshot(ROOT, "{version}")` \
(`pip install ./reader`: pyarrow, polars, deltalake, numpy, nibabel, Pillow) |

`files/<table>.txt` lists exactly the Parquet files this release pins (a glob over `../tables/<table>/` would
read every release's files). `views/pair_images.parquet` gives each pair's representative prior and current image
(`image_key` of the `images` table: same modality and view, 2D first, then by key); `views/vqa_images.parquet`
each VQA item's images in question order. Volumes are NIfTI-1 objects at `payload_uri`, relative to the storage
root (`../../` from here): `nibabel.load`, MONAI `LoadImage`, SimpleITK and ITK-SNAP open them directly.
"""


def hf_card(manifest: dict, schemas: dict[str, pa.Schema], card_md: str) -> str:
    """The Hugging Face dataset card (``README.md``) of a release: YAML front matter, then ``card_md`` and
    :data:`READ_ME`. Tables without data files get no config (the card lists them as empty)."""
    configs, infos = [], []
    for t in manifest["tables"]:
        paths = _relative(manifest, t)
        if not paths:
            continue
        configs.append({"config_name": t, "data_files": [{"split": HF_SPLIT, "path": paths}]})
        infos.append(
            {
                "config_name": t,
                "features": [hf_feature(f.name, f.type, image=f.name in IMAGE_COLUMNS.get(t, ())) for f in schemas[t]],
            }
        )
    for name, entry in manifest.get("views", {}).items():
        configs.append({"config_name": name, "data_files": [{"split": HF_SPLIT, "path": [entry["path"]]}]})
        infos.append({"config_name": name, "features": [hf_feature(f.name, f.type) for f in VIEW_SCHEMAS[name]]})
    front = {
        "pretty_name": f"MedReCo-DB {manifest['version']}",
        "license": "other",
        "tags": ["medical", "radiology", "dicom", "longitudinal", "vqa"],
        "configs": configs,
        "dataset_info": infos,
    }
    # JSON is YAML (flow style): what the Hub and `datasets` parse with yaml.safe_load, written 20x faster than
    # PyYAML's pure-Python dumper and byte-stable wherever libyaml is or is not installed
    return (
        "---\n"
        + json.dumps(front, indent=1)
        + "\n---\n\n"
        + card_md.rstrip("\n")
        + "\n\n"
        + READ_ME.format(version=manifest["version"], split=HF_SPLIT)
    )


def _context() -> dict:
    return json.loads(resources.files("etl.snapshots").joinpath("croissant_context.json").read_text())


def _cr_type(typ: pa.DataType, image: bool) -> str:
    if image:
        return "sc:ImageObject"
    if pa.types.is_integer(typ):
        return "sc:Integer"
    if pa.types.is_floating(typ):
        return "sc:Float"
    if pa.types.is_boolean(typ):
        return "sc:Boolean"
    if pa.types.is_timestamp(typ):
        return "sc:DateTime"
    if pa.types.is_date(typ):
        return "sc:Date"
    return "sc:Text"


def _cr_fields(record: str, schema: pa.Schema, source: dict, images: tuple[str, ...] = ()) -> list[dict]:
    out = []
    for f in schema:
        typ, repeated = f.type, False
        if pa.types.is_list(typ):
            typ, repeated = typ.value_type, True
        field: dict[str, Any] = {
            "@type": "cr:Field",
            "@id": f"{record}/{f.name}",
            "name": f.name,
            "source": {**source, "extract": {"column": f.name}},
        }
        if pa.types.is_struct(typ):
            field["subField"] = [
                {
                    "@type": "cr:Field",
                    "@id": f"{record}/{f.name}/{typ.field(i).name}",
                    "name": typ.field(i).name,
                    "dataType": _cr_type(typ.field(i).type, False),
                    "source": {**source, "extract": {"column": f.name}, "transform": {"jsonPath": typ.field(i).name}},
                }
                for i in range(typ.num_fields)
            ]
        else:
            field["dataType"] = _cr_type(typ, f.name in images)
        if repeated:
            field["repeated"] = True
        out.append(field)
    return out


def croissant(manifest: dict, schemas: dict[str, pa.Schema]) -> dict:
    """The Croissant 1.0 JSON-LD description of a release (``croissant.json``): one ``FileObject`` per pinned
    file (``contentUrl`` relative to the release folder, its sha256, which ``mlcroissant`` checks on reading), a
    ``FileSet`` over them for a table of several files, and one ``RecordSet`` per table and view, a ``Field`` per column
    (lists ``repeated``, structs as ``subField``, the ``images`` PNG column ``sc:ImageObject``)."""
    version = manifest["version"]
    distribution: list[dict] = []
    records: list[dict] = []
    sources = [
        (
            t,
            _relative(manifest, t),
            [f["sha256"] for f in manifest["tables"][t]["files"]],
            schemas[t],
            IMAGE_COLUMNS.get(t, ()),
        )
        for t in manifest["tables"]
    ]
    sources += [(n, [e["path"]], [e["sha256"]], VIEW_SCHEMAS[n], ()) for n, e in manifest.get("views", {}).items()]
    for name, paths, shas, schema, images in sources:
        if not paths:
            continue
        objects = [
            {
                "@type": "cr:FileObject",
                "@id": f"{name}/file-{i}",
                "name": f"{name}-file-{i}",
                "contentUrl": path,
                "encodingFormat": "application/x-parquet",
                "sha256": sha,
            }
            for i, (path, sha) in enumerate(zip(paths, shas, strict=True))
        ]
        distribution += objects
        if len(objects) == 1:  # fields read from the one file
            source = {"fileObject": {"@id": objects[0]["@id"]}}
        else:  # fields read from the table's files together
            fileset = f"{name}-files"
            distribution.append(
                {
                    "@type": "cr:FileSet",
                    "@id": fileset,
                    "name": fileset,
                    "containedIn": [{"@id": o["@id"]} for o in objects],
                    "encodingFormat": "application/x-parquet",
                    "includes": "*.parquet",
                }
            )
            source = {"fileSet": {"@id": fileset}}
        records.append(
            {
                "@type": "cr:RecordSet",
                "@id": name,
                "name": name,
                "description": f"table {name} of MedReCo-DB {version}"
                + (
                    f" (key: {', '.join(manifest['tables'][name]['key'])})" if name in manifest["tables"] else " (view)"
                ),
                "field": _cr_fields(name, schema, source, images),
            }
        )
    return {
        "@context": _context(),
        "@type": "sc:Dataset",
        "name": "MedReCo-DB",
        "conformsTo": "http://mlcommons.org/croissant/1.0",
        "description": "De-identified, entity-labelled, longitudinally paired comparative imaging dataset "
        f"(release {version}, content hash {manifest['content_hash']}).",
        "version": version,
        "datePublished": manifest["created_at"],
        "license": "other",
        "url": "https://github.com/medreco/medreco-db",
        "citeAs": f"MedReCo-DB {version}",
        "distribution": distribution,
        "recordSet": records,
    }


def file_lists(manifest: dict) -> dict[str, str]:
    """``files/<table>.txt`` per table: its pinned files relative to the release folder, one a line."""
    return {f"{FILE_LISTS}/{t}.txt": "".join(p + "\n" for p in _relative(manifest, t)) for t in manifest["tables"]}


def release_extras(manifest: dict, schemas: dict[str, pa.Schema], card_md: str) -> dict[str, bytes]:
    """Every file of :mod:`this module <etl.snapshots.ecosystem>` but the views, by path in the release folder
    (``manifest`` must already name its ``views``)."""
    out = {f: text.encode() for f, text in file_lists(manifest).items()}
    out[HF_CARD] = hf_card(manifest, schemas, card_md).encode()
    out[CROISSANT] = (json.dumps(croissant(manifest, schemas), indent=1, sort_keys=True) + "\n").encode()
    return out
