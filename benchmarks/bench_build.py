"""Benchmark: the whole build DAG on archives with real-sized pixels at sizes that double, per task.

What is built. :func:`etl.demo.corpus.generate_corpus` with ``pixels="archive"``: the demo's 8 institutions, patients,
headers, PHI and reports, with real-sized pixels (CR/DX 1900 x 1800 from the real RG1 chest radiograph, chest CT
series of 300, 100 and 200 slices of 512 x 512 taken in turn from the real 693 CT slice, MR series of 64 slices of
256 x 256 from the real MR2 image, full 480 x 640 ultrasound frames), uncompressed. That is the ``ct-heavy`` mix (the
default: about 53 DICOM files per images row); ``--mix chest`` builds what MedReCo-DB mostly holds instead, 4 chest
radiograph patients to 1 chest CT patient with 120-slice series (``etl.demo.corpus.ARCHIVE_MIXES``: 77-79% radiograph
rows at 8 and 16 patients). Corpora are cached under ``$MEDRECO_BENCH_CACHE`` (default ``~/.cache/medreco-bench``),
keyed by the generator's code. The config is the demo's institutions with the real defaults (``ct_spacing_mm`` 0.75 x
0.75 x 1.5 mm, 480 x 480 2D images), a pixel-cleaning rule for the ultrasound device's full frames, and a fixed shard
count (``--shards``, default 4): the archive doubles, the config does not. Burned-in text OCR stays on
(``deid.burned_in_text.ocr``, the production default; the run stops if the config turns it off).

How it is run. Every task of ``dags/medreco_build.py`` (checked against the DAG: same task ids, an order that
respects its dependencies) runs in its own fresh Python process, one after the other, calling the same function the
DAG task calls (``etl.pipeline.stages`` / ``quality.gate`` / ``etl.pipeline.lock``), one process per map index for the
mapped tasks, as Airflow's task runner gives each task instance a process of its own. Each process reports its own
peak resident set (``VmHWM``, the high-water mark of its address space since ``exec``; ``ru_maxrss`` would carry the
forking parent's size over) and the parent collects its CPU time with ``os.wait4`` (``ru_utime + ru_stime``): an
honest per-task peak, which ``dag.test()`` (every task in one process, RSS that never shrinks) cannot give. ``floor`` is
a process that imports the stage modules and does nothing: the interpreter and library share of every figure.

What is measured. Per stage (all map indices of a task together): wall seconds, CPU seconds, CPU seconds per DICOM
file, per images row and per series (``per core``: one process uses one core), and the peak RSS of its largest task
instance; the images rows and DICOM files per modality. Then one new
patient (a patient of a second corpus, the same one at every size) is delivered and the DAG runs again: the
snapshot task's seconds and the bytes it wrote under ``snapshots/`` (hard links to curated files counted apart).
Ends with ``BENCH build ...``: the peak RSS ratio per doubling of every stage (worst first) and of the incremental
publish, against the smallest size measured in the same run.

Usage: ``python benchmarks/bench_build.py [--sizes 8,16] [--shards 4] [--mix ct-heavy|chest] [--keep DIR]``
(patients per size; the demo generator needs at least 8). ``--report DIR`` prints the tables again from the figures
a ``--keep DIR`` run saved.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the build DAG's tasks in an order that respects its dependencies; the second item names a mapped task's argument
TASKS: tuple[tuple[str, str | None], ...] = (
    ("build_lock", None),
    ("institutions", None),
    ("discover", "institution"),
    ("plan", None),
    ("deidentify", "batch"),
    ("normalise", "batch"),
    ("reports", None),
    ("entities", "batch"),
    ("assemble", "batch"),
    ("retrieval", None),
    ("ledger", None),
    ("quality", None),
    ("snapshot", None),
    ("release_lock", None),
)
SEED = 11
NEW_PATIENT_SEED = 911
CACHE = Path(os.environ.get("MEDRECO_BENCH_CACHE", Path.home() / ".cache" / "medreco-bench"))
BENCH_KEY = "medreco-bench-key-" + "ab" * 24
#: voxels one volume may have in the bench config: a 300-slice 512 x 512 series with room to spare
VOLUME_MAX_VOXELS = 100_000_000


# ---- the child: one DAG task in this process --------------------------------------------------------------


def _task(name: str, cfg: str, run_id: str, arg: object) -> object:
    """Run one task of the build DAG as its DAG callable does (dags/medreco_build.py), returning its result."""
    from etl.pipeline import stages
    from etl.pipeline.context import BuildContext
    from etl.pipeline.runtime import quiet_library_logs
    from quality.gate import quality_stage

    quiet_library_logs()
    if name == "floor":
        return None
    ctx = BuildContext.from_config_file(cfg, run_id=run_id)
    if name == "build_lock":
        from etl.pipeline.lock import acquire_for_run

        return acquire_for_run(ctx.storage, ctx.run_id)
    if name == "release_lock":
        from etl.pipeline.lock import release_for_run

        return release_for_run(ctx.storage, ctx.run_id)
    if name == "institutions":
        ctx.check_key()
        return [i.id for i in ctx.cfg.institutions]
    per_shard = {
        "deidentify": stages.deidentify_shard,
        "normalise": stages.normalise_shard,
        "entities": stages.entities_shard,
        "assemble": stages.assemble_shard,
    }
    if name in per_shard:
        return [per_shard[name](ctx, s) for s in arg]
    if name == "discover":
        return stages.discover(ctx, arg)
    whole = {
        "plan": stages.plan,
        "reports": stages.reports,
        "retrieval": stages.retrieval,
        "ledger": stages.finalise,
        "quality": quality_stage,
        "snapshot": stages.publish_stage,
    }
    return whole[name](ctx)


def _own_peak_rss() -> int:
    """This process's peak resident set in bytes since its ``exec``: ``VmHWM`` of ``/proc/self/status``.

    Not ``ru_maxrss``: Linux carries the pre-``exec`` memory of the forking parent into a child's ``ru_maxrss``
    (``setmax_mm_hiwater_rss`` at exec), so a child of a large parent would report the parent's size.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(argv: list[str]) -> None:
    name, cfg, run_id, arg, out = argv
    t = time.perf_counter()
    result = _task(name, cfg, run_id, json.loads(arg))
    Path(out).write_text(
        json.dumps({"result": result, "stage_s": time.perf_counter() - t, "peak_rss": _own_peak_rss()}, default=str)
    )


# ---- the parent: run the DAG task by task, each in its own process ----------------------------------------


@dataclass
class TaskFigure:
    """One task instance: ``name``, map ``arg``, wall/CPU seconds, the process's peak RSS in bytes."""

    name: str
    arg: object
    wall_s: float
    cpu_s: float
    peak_rss: int
    stage_s: float
    result: object = None


@dataclass
class BuildFigures:
    """Every task instance of one DAG run, in run order."""

    tasks: list[TaskFigure] = field(default_factory=list)

    def stage(self, name: str) -> dict:
        """Figures of one stage: its task instances summed (seconds) and their largest peak RSS."""
        ts = [t for t in self.tasks if t.name == name]
        return {
            "n": len(ts),
            "wall_s": sum(t.wall_s for t in ts),
            "cpu_s": sum(t.cpu_s for t in ts),
            "stage_s": sum(t.stage_s for t in ts),
            "peak_rss": max(t.peak_rss for t in ts),
        }


def run_task(name: str, cfg: str, run_id: str, arg: object = None, env: dict | None = None) -> TaskFigure:
    """Run one task in a fresh process; its own rusage gives the peak RSS and CPU time.

    Raises
    ------
    RuntimeError
        when the task's process fails (its stderr's last lines are in the message).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "result.json", Path(tmp) / "stderr"
        t = time.perf_counter()
        with open(err, "wb") as ferr:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--task", name, cfg, run_id, json.dumps(arg), str(out)],
                stdout=subprocess.DEVNULL,
                stderr=ferr,
                env=env,
            )
            _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            tail = err.read_text(errors="replace").strip().splitlines()[-8:]
            raise RuntimeError(f"task {name}[{arg}] failed ({proc.returncode}): " + " | ".join(tail))
        data = json.loads(out.read_text())
    return TaskFigure(
        name, arg, wall, usage.ru_utime + usage.ru_stime, data["peak_rss"], data["stage_s"], data["result"]
    )


def check_dag_order() -> None:
    """Check :data:`TASKS` against the build DAG: the same task ids, each after all its upstream tasks.

    Raises
    ------
    AssertionError
        naming the task that differs.
    """
    with tempfile.TemporaryDirectory() as home:
        env = {
            **os.environ,
            "AIRFLOW_HOME": home,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        code = (
            "import json; from dags.medreco_build import build_dag as d; "
            "print(json.dumps({t.task_id: sorted(t.upstream_task_ids) for t in d.tasks}))"
        )
        upstream = json.loads(
            subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
    order = [n for n, _ in TASKS]
    assert set(order) == set(upstream), f"TASKS {sorted(order)} != DAG tasks {sorted(upstream)}"
    for i, name in enumerate(order):
        late = [u for u in upstream[name] if order.index(u) > i]
        assert not late, f"{name} runs before its upstream {late}"


def measure_build(cfg: str, run_id: str, env: dict) -> BuildFigures:
    """Run the build DAG once on ``cfg``, every task instance in its own process, in :data:`TASKS` order.

    Mapped tasks are expanded as the DAG expands them: ``discover`` over the ``institutions`` result, the per-shard
    stages over the ``plan`` result (batches of shards). Returns every task instance's figures.
    """
    figs = BuildFigures()
    mapped: dict[str, list] = {}
    for name, argname in TASKS:
        args = [None] if argname is None else mapped["institution" if argname == "institution" else "batch"]
        for arg in args:
            f = run_task(name, cfg, run_id, arg, env)
            figs.tasks.append(f)
            if name == "institutions":
                mapped["institution"] = f.result
            elif name == "plan":
                mapped["batch"] = f.result
    return figs


# ---- archives ---------------------------------------------------------------------------------------------


def _generator_hash() -> str:
    """Hash of every file of the demo generator (``etl/demo/``: code and phrase books), so a cached archive is
    remade when any of them changes (the German/Spanish reports and heads live in files of their own)."""
    h = hashlib.sha256()
    for f in sorted((ROOT / "etl" / "demo").glob("*")):
        if f.is_file() and f.suffix in (".py", ".yaml", ".json"):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def archive(patients: int, seed: int = SEED, mix: str = "ct-heavy") -> Path:
    """The cached corpus of ``patients`` patients with real-sized pixels at ``mix`` (``etl.demo.corpus.ARCHIVE_MIXES``;
    generated once per generator version)."""
    from etl.demo.corpus import generate_corpus

    tag = "" if mix == "ct-heavy" else f"-{mix}"
    out = CACHE / f"archive-p{patients}-s{seed}{tag}-{_generator_hash()}"
    if not (out / ".complete").is_file():
        shutil.rmtree(out, ignore_errors=True)
        generate_corpus(out, seed=seed, n_patients=patients, pixels="archive", mix=mix)
        (out / ".complete").write_text("ok\n")
    return out


def new_patient() -> tuple[str, list[tuple[Path, str]], list[dict]]:
    """One patient of a second corpus, the same at every size: its institution, DICOM files (path, relative
    name) and report records (report ids renamed so they cannot collide with the archive's). The patient with a
    CT study, first by MRN, else the first by MRN."""
    src = archive(8, NEW_PATIENT_SEED)
    files: dict[str, list[str]] = {}
    for line in (src / "answer_key" / "phi.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["location"] == "dicom:PatientID":
            files.setdefault(r["value"], []).append(r["file"])
    reports = {}
    for f in sorted(src.glob("sources/*/reports/reports.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            reports.setdefault(rec["patient_id"], []).append(rec)
    import pydicom

    with_ct = [
        m
        for m in sorted(files)
        if any(pydicom.dcmread(src / f, stop_before_pixels=True).Modality == "CT" for f in files[m])
    ]
    mrn = (with_ct or sorted(files))[0]
    inst = files[mrn][0].split("/")[1]
    recs = [{**r, "report_id": f"NEW-{r['report_id']}"} for r in reports.get(mrn, [])]
    return inst, [(src / f, f.split("/dicom/", 1)[1]) for f in sorted(files[mrn])], recs


def write_config(corpus: Path, root: Path, shards: int) -> Path:
    """The bench config: the demo's institutions on ``corpus``'s sources, real normalisation defaults."""
    import yaml

    data = yaml.safe_load((ROOT / "config" / "demo.yaml").read_text())
    data["name"] = "medreco-bench-archive"
    data["storage"] = {"root": str(root)}
    data["shard_count"] = shards
    # the real defaults (ct_spacing_mm 0.75/0.75/1.5, 2D 480 x 480), but room for a 300-slice 512 x 512 series
    # (78.6 M voxels; the default volume_max_voxels, 64 M, quarantines it as volume_too_large)
    data["normalisation"] = {"volume_max_voxels": VOLUME_MAX_VOXELS}
    data["deid"]["pixel_cleaning"].append(  # the ultrasound device's full frames: its header text band
        {"manufacturer": "MEDRECO DEMO IMAGING", "rows": 480, "columns": 640, "regions": [[0, 0, 640, 40]]}
    )
    from schemas.config import BurnedInTextConfig

    ocr = BurnedInTextConfig.model_validate(data["deid"].get("burned_in_text", {}))
    if not ocr.ocr or ocr.ocr_off:  # the figures are the production default's: OCR on every file
        raise RuntimeError(f"the bench config turns burned-in text OCR off somewhere: {ocr}")
    root.mkdir(parents=True, exist_ok=True)
    for inst in sorted((corpus / "sources").iterdir()):  # the pipeline never writes under sources/: link it
        (root / "sources").mkdir(exist_ok=True)
        shutil.copytree(inst, root / "sources" / inst.name, copy_function=os.link)
    cfg = root.parent / f"{root.name}.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg


def deliver(root: Path, inst: str, files: list[tuple[Path, str]], records: list[dict]) -> int:
    """Add one patient's files and reports to ``inst``'s source folder; returns the bytes delivered."""
    n = 0
    for path, rel in files:
        target = root / "sources" / inst / "dicom" / "new-delivery" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, target)
        n += path.stat().st_size
    (root / "sources" / inst / "reports" / "new-delivery.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records)
    )
    return n


def _inodes(top: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for p in top.rglob("*"):
        if p.is_file():
            s = p.stat()
            out[str(p)] = (s.st_ino, s.st_size, s.st_nlink)
    return out


def _written(before: dict, after: dict) -> tuple[int, int]:
    """(bytes of files created or replaced, bytes of new hard links to existing files)."""
    new = [(size, links) for p, (ino, size, links) in after.items() if before.get(p, (None,))[0] != ino]
    return sum(s for s, n in new if n == 1), sum(s for s, n in new if n > 1)


def _per_modality(corpus: Path, st) -> dict:
    """Images rows (curated ``images``) and delivered DICOM files (every file of ``sources/*/dicom``) by modality."""
    import polars as pl

    rows = pl.from_arrow(st.read_table("curated/images", schema=None, columns=["modality"]))
    assert isinstance(rows, pl.DataFrame)
    files: dict[str, int] = {}
    import pydicom

    for f in (corpus / "sources").glob("*/dicom/**/*"):
        if not f.is_file():
            continue
        try:
            m = str(pydicom.dcmread(f, stop_before_pixels=True, force=True).get("Modality", "?"))
        except Exception:  # noqa: BLE001 - a cut-off copy: counted, not named
            m = "?"
        files[m] = files.get(m, 0) + 1
    return {
        "rows": {
            r["modality"]: r["len"] for r in rows.group_by("modality").len().sort("modality").iter_rows(named=True)
        },
        "files": dict(sorted(files.items())),
    }


def measure_size(patients: int, shards: int, workdir: Path, env: dict, log, mix: str = "ct-heavy") -> dict:
    """Build the archive of ``patients`` patients at ``mix``, then deliver one new patient and build again."""
    corpus = archive(patients, mix=mix)
    root = workdir / f"p{patients}" / "root"
    cfg = str(write_config(corpus, root, shards))
    full = measure_build(cfg, f"bench__p{patients}__full", env)
    log(f"  p{patients}: full build {sum(t.wall_s for t in full.tasks):.0f} s")
    from etl.storage import Storage

    images = sum(1 for _ in (root / "curated" / "dicom").rglob("*") if _.is_file())  # before the new patient
    curated = {
        z: sum(p.stat().st_size for p in (root / "curated" / z).rglob("*") if p.is_file())
        for z in ("dicom", "volumes", "images")
    }
    curated["other"] = sum(p.stat().st_size for p in (root / "curated").rglob("*") if p.is_file()) - sum(
        curated.values()
    )
    st = Storage.open(str(root))
    by_modality = _per_modality(corpus, st)
    tbl = {
        t: st.read_table(f"curated/{t}", schema=None, columns=[c]).num_rows
        for t, c in (("images", "image_key"), ("series", "series_key"), ("studies", "study_key"))
    }
    inst, files, recs = new_patient()
    delivered = deliver(root, inst, files, recs)
    time.sleep(2.1)  # the partition hash cache trusts files older than itself by 2 s (racy-git rule)
    before = _inodes(root / "snapshots")
    inc = measure_build(cfg, f"bench__p{patients}__inc", env)
    written, linked = _written(before, _inodes(root / "snapshots"))
    snap = inc.stage("snapshot")
    versions = (full.tasks[-2].result or {}).get("version"), (inc.tasks[-2].result or {}).get("version")
    import polars as pl

    led = pl.from_arrow(
        st.read_table(
            f"ledger/run_id=bench__p{patients}__full/ledger.parquet", schema=None, columns=["status", "reason"]
        )
    )
    statuses = {
        f"{r['status']}:{r['reason']}" if r["reason"] else r["status"]: r["len"]
        for r in led.group_by(["status", "reason"]).len().sort("status", "reason").iter_rows(named=True)
    }
    return {
        "patients": patients,
        "mix": mix,
        "by_modality": by_modality,
        "full": full,
        "inc": inc,
        "images": tbl["images"],
        "ledger": statuses,
        "curated_bytes": curated,
        "series": tbl["series"],
        "studies": tbl["studies"],
        "dicom_files": images,
        "source_bytes": sum(p.stat().st_size for p in (corpus / "sources").rglob("*") if p.is_file()),
        "new_patient": {"files": len(files), "reports": len(recs), "bytes": delivered},
        "publish_s": snap["wall_s"],
        "publish_stage_s": snap["stage_s"],
        "publish_written": written,
        "publish_linked": linked,
        "versions": versions,
    }


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def report(sizes: list[dict], floor: TaskFigure, load: tuple, log) -> None:
    """Print the per-stage tables and the ``BENCH build`` line."""
    stages = [n for n, _ in TASKS]
    for m in sizes:
        full = m["full"]
        log(
            f"\n{m['patients']} patients ({m.get('mix', 'ct-heavy')} mix): {m['studies']} studies, "
            f"{m['series']} series, {m['images']} images rows "
            f"({m['dicom_files']} DICOM files, {m['source_bytes'] / 2**30:.2f} GiB delivered); "
            f"ledger {m['ledger']}; curated MiB "
            + ", ".join(f"{z} {b / 2**20:.0f}" for z, b in m["curated_bytes"].items())
        )
        if "by_modality" in m:
            log(
                "  per modality: images rows "
                + ", ".join(f"{k} {v}" for k, v in m["by_modality"]["rows"].items())
                + "; source DICOM files "
                + ", ".join(f"{k} {v}" for k, v in m["by_modality"]["files"].items())
            )
        log(
            f"  {'stage':13s} {'tasks':>5s} {'wall_s':>8s} {'cpu_s':>8s} {'cpu_s/file':>10s} {'cpu_s/row':>9s} "
            f"{'cpu_s/series':>12s} {'peak_GiB':>8s} {'above_floor_GiB':>15s}"
        )
        for name in stages:
            s = full.stage(name)
            log(
                f"  {name:13s} {s['n']:5d} {s['wall_s']:8.1f} {s['cpu_s']:8.1f} {s['cpu_s'] / m['dicom_files']:10.4f} "
                f"{s['cpu_s'] / m['images']:9.3f} {s['cpu_s'] / max(1, m['series']):12.3f} {_gib(s['peak_rss']):>8s} "
                f"{_gib(s['peak_rss'] - floor.peak_rss):>15s}"
            )
        total = sum(t.cpu_s for t in full.tasks)
        log(
            f"  {'build':13s} {len(full.tasks):5d} {sum(t.wall_s for t in full.tasks):8.1f} {total:8.1f} "
            f"{total / m['dicom_files']:10.4f} {total / m['images']:9.3f} {total / max(1, m['series']):12.3f}"
        )
        inc = m["inc"]
        log(
            f"  one new patient ({m['new_patient']['files']} files, {m['new_patient']['bytes'] / 2**20:.0f} MiB, "
            f"{m['new_patient']['reports']} reports), release {m['versions'][0]} -> {m['versions'][1]}: whole run "
            f"{sum(t.wall_s for t in inc.tasks):.0f} s; snapshot task {m['publish_s']:.2f} s "
            f"({m['publish_stage_s']:.2f} s in the stage), wrote {m['publish_written'] / 2**10:.0f} KiB, "
            f"hard-linked {m['publish_linked'] / 2**20:.1f} MiB, peak {_gib(inc.stage('snapshot')['peak_rss'])} GiB"
        )
        log(
            "  incremental run per stage (wall_s / peak_GiB): "
            + ", ".join(f"{n} {inc.stage(n)['wall_s']:.1f}/{_gib(inc.stage(n)['peak_rss'])}" for n in stages)
        )
    base, big = sizes[0], sizes[-1]
    import math

    doublings = math.log2(big["patients"] / base["patients"]) if len(sizes) > 1 else 1.0
    ratios = {}
    for name in stages:
        r = big["full"].stage(name)["peak_rss"] / base["full"].stage(name)["peak_rss"]
        ratios[name] = r ** (1 / doublings)
    worst = sorted(ratios.items(), key=lambda kv: -kv[1])
    inc_rss = (big["inc"].stage("snapshot")["peak_rss"] / base["inc"].stage("snapshot")["peak_rss"]) ** (1 / doublings)
    pub = [m["publish_s"] for m in sizes]
    log(
        f"\nfloor (interpreter + stage modules) peak {_gib(floor.peak_rss)} GiB; load average before/after "
        f"{load[0]:.2f}/{load[1]:.2f} on {os.cpu_count()} cores"
    )
    print(
        f"BENCH build mix={sizes[0].get('mix', 'ct-heavy')} patients="
        + ",".join(str(m["patients"]) for m in sizes)
        + " images="
        + ",".join(str(m["images"]) for m in sizes)
        + f" rss_ratio_per_doubling_max={worst[0][1]:.3f}({worst[0][0]})"
        + " "
        + " ".join(f"rss_ratio_{n}={r:.3f}" for n, r in worst)
        + " normalise_cpu_s_per_file="
        + ",".join(f"{m['full'].stage('normalise')['cpu_s'] / m['dicom_files']:.4f}" for m in sizes)
        + " build_cpu_s_per_image_row="
        + ",".join(f"{sum(t.cpu_s for t in m['full'].tasks) / m['images']:.2f}" for m in sizes)
        + " build_cpu_s_per_file="
        + ",".join(f"{sum(t.cpu_s for t in m['full'].tasks) / m['dicom_files']:.4f}" for m in sizes)
        + " build_wall_s="
        + ",".join(f"{sum(t.wall_s for t in m['full'].tasks):.0f}" for m in sizes)
        + " publish_one_patient_s="
        + ",".join(f"{p:.2f}" for p in pub)
        + f" publish_ratio={pub[-1] / pub[0]:.2f} publish_rss_ratio={inc_rss:.3f}"
        + " publish_written_kib="
        + ",".join(f"{m['publish_written'] / 1024:.0f}" for m in sizes)
        + f" load_avg={load[0]:.2f},{load[1]:.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    """Command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,16", help="patients per archive, comma-separated (each >= 8), e.g. 8,16,32")
    ap.add_argument("--shards", type=int, default=4, help="patient-hash shards (fixed across sizes)")
    ap.add_argument("--mix", default="ct-heavy", help="archive mix: ct-heavy (default) or chest (ARCHIVE_MIXES)")
    ap.add_argument("--keep", type=Path, help="build under this folder and keep it (default: a temporary folder)")
    ap.add_argument("--report", type=Path, help="print the tables of a --keep DIR run again from its figures.pickle")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    log = lambda s: print(s, flush=True)  # noqa: E731
    if args.report is not None:
        import pickle

        results, floor, load = pickle.loads((args.report / "figures.pickle").read_bytes())
        report(results, floor, load, log)
        return
    from etl.demo.corpus import ARCHIVE_MIXES

    if args.mix not in ARCHIVE_MIXES:
        ap.error(f"--mix {args.mix!r}: one of {', '.join(ARCHIVE_MIXES)}")
    check_dag_order()
    env = {
        **os.environ,
        "MEDRECO_PSEUDONYM_KEY": os.environ.get("MEDRECO_PSEUDONYM_KEY", BENCH_KEY),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    t = time.perf_counter()
    for n in sizes:
        archive(n, mix=args.mix)
    archive(8, NEW_PATIENT_SEED)
    log(f"archives ready in {time.perf_counter() - t:.0f} s under {CACHE}")
    load0 = os.getloadavg()[0]
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-build-"))
    try:
        floor = run_task("floor", "-", "-", None, env)
        results = [measure_size(n, args.shards, work, env, log, args.mix) for n in sizes]
        if args.keep is not None:  # the raw figures, for a report written later
            import pickle

            (work / "figures.pickle").write_bytes(pickle.dumps((results, floor, (load0, os.getloadavg()[0]))))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    report(results, floor, (load0, os.getloadavg()[0]), log)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--task"]:
        _child(sys.argv[2:])
    else:
        main()
