"""Benchmark: the pixel stages of one build with N LocalExecutor workers against the serial ``dag.test()`` run.

:func:`speedup` builds the same archive twice into fresh storage roots, once with ``workers=1`` (``dag.test()`` in
this process, one task at a time) and once with ``workers=N`` (a real scheduler with the LocalExecutor,
:mod:`medreco.cli.scheduled`), and reads each run's task instances back from the metadata database. The pixel stages
are ``deidentify`` and ``normalise`` (every file's pixels are read, decoded, written); their time is the wall
clock from the first ``deidentify`` instance's start to the last ``normalise`` instance's end, so the
scheduler's start-up (outside the run) is not in it but each task process's warm-up (fork, DAG parse, imports,
first-use caches) is. Both builds must publish the same content hash.

Run as a script, it writes an archive of real-sized radiographs first: the Philips CR chest PA of WG04
(``../shared/data/dicom/chest-cr-dx``, 1955 x 1841 pixels, uncompressed and JPEG 2000), one of each per patient
under new patient ids and UIDs (so the files spread over the patient-hash shards), prints one timeline line per
run and pixel stage (:func:`stage_timeline`; in the serial run ``spread_s`` is the later task's duration), and ends
with one line
``BENCH workers speedup_pixel_stages=... process_ceiling=... workers=... pixel_s_serial=... pixel_s_workers=...
build_s_serial=... build_s_workers=... files=... load_1m_before=... load_1m_after=...``. The machine is shared: the load
averages are part of the figure. Usage: ``python benchmarks/bench_workers.py [patients] [workers]`` (default 32, 2);
``BENCH_MAX_MAP_LENGTH`` sets the mapped tasks per stage, ``BENCH_WORK_DIR`` keeps the roots and the Airflow home.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schemas.config import PROJECT_ROOT  # noqa: E402

SHARED = PROJECT_ROOT.parent / "shared" / "data" / "dicom" / "chest-cr-dx"
RADIOGRAPHS = ("wg04_RG1_UNCR_cr_chest_philips_uncompressed.dcm", "wg04_RG1_J2KI_cr_chest_philips.dcm")
PIXEL_STAGES = ("deidentify", "normalise")
BENCH_KEY = "medreco-bench-workers-0123456789abcdef0123456789"


def write_archive(out: Path, patients: int) -> Path:
    """``out/sources/bench/`` with ``patients`` x the two real radiographs, each patient with its own PatientID,
    name and UIDs (derived from the index, so the same call writes the same files). Returns ``out``."""
    import pydicom
    from pydicom.uid import generate_uid

    src = out / "sources" / "bench"
    src.mkdir(parents=True, exist_ok=True)
    originals = [pydicom.dcmread(SHARED / name) for name in RADIOGRAPHS]
    for p in range(patients):
        study = generate_uid(entropy_srcs=["bench-workers", "study", str(p)])
        for k, ds in enumerate(originals):
            ds.PatientID, ds.PatientName = f"BENCH{p:05d}", f"BENCH^PATIENT{p:05d}"
            ds.StudyInstanceUID = study
            ds.SeriesInstanceUID = generate_uid(entropy_srcs=["bench-workers", "series", str(p), str(k)])
            ds.SOPInstanceUID = generate_uid(entropy_srcs=["bench-workers", "sop", str(p), str(k)])
            ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
            ds.save_as(src / f"p{p:05d}_{k}.dcm", enforce_file_format=True)
    return out


def _normalise_loop(path: str, n: int) -> None:
    import pydicom

    from etl.pixels.normalise import normalise_2d
    from schemas.config import NormalisationConfig

    cfg = NormalisationConfig(image_size=[256, 256])
    for _ in range(n):
        normalise_2d(pydicom.dcmread(path), cfg)


def process_ceiling(workers: int, files: int = 12, rounds: int = 2) -> float:
    """What ``workers`` plain processes get out of this machine now: the throughput of ``workers`` processes each
    normalising the JPEG 2000 radiograph ``files`` times, over that of one process (best of ``rounds``,
    alternating). On an idle machine of ``workers`` cores it is near ``workers``; on a shared one it is the most
    the build's workers can reach at that moment."""
    from multiprocessing import get_context

    path = str(SHARED / RADIOGRAPHS[1])
    _normalise_loop(path, 1)  # imports and decoder plugins, before the forks
    best = {1: float("inf"), workers: float("inf")}
    ctx = get_context("fork")
    for _ in range(rounds):
        for k in (1, workers):
            t0 = time.perf_counter()
            procs = [ctx.Process(target=_normalise_loop, args=(path, files)) for _ in range(k)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            best[k] = min(best[k], (time.perf_counter() - t0) / k)  # seconds per process-load of files
    return round(best[1] / best[workers], 2)


def _config(archive_dir: Path, root: Path, shard_count: int, max_map_length: int) -> Path:
    data = yaml.safe_load((PROJECT_ROOT / "config" / "demo.yaml").read_text())
    data["name"] = "bench-workers"
    data["storage"] = {"root": str(root)}
    data["shard_count"], data["max_map_length"] = shard_count, max_map_length
    data["splits"]["external_test_institutions"] = []
    data["institutions"] = [
        {
            "id": d.name,
            "country": "US",
            "language": "en",
            "timezone": "America/New_York",
            "source_uri": str(d.resolve()),
            "report_format": "none",
        }
        for d in sorted((Path(archive_dir) / "sources").iterdir())
        if d.is_dir()
    ]
    path = root.parent / f"{root.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _pixel_seconds(run_id: str) -> float:
    from medreco.cli.progress import read_task_rows

    rows = [r for r in read_task_rows("medreco_build", run_id) if r.task_id in PIXEL_STAGES]
    starts = [r.start for r in rows if r.task_id == "deidentify" and r.start is not None]
    ends = [r.end for r in rows if r.task_id == "normalise" and r.end is not None]
    return max(ends) - min(starts)


def stage_timeline(run_id: str, stages: tuple[str, ...] = PIXEL_STAGES) -> dict[str, dict]:
    """Per stage of one run, from its task instances in the metadata database (queued, start and end dates).

    Returns
    -------
    dict
        ``{stage: {"tasks": n, "mean_task_s": mean end - start, "wait_s": mean start - queued (a free worker
        taking the task), "gap_s": first start - previous stage's last end (the scheduler's latency at the
        barrier; absent for the first stage), "spread_s": last end - first end (imbalance between the stage's
        mapped tasks)}}``, seconds.
    """
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(
                TaskInstance.task_id, TaskInstance.queued_dttm, TaskInstance.start_date, TaskInstance.end_date
            )
            .filter(
                TaskInstance.dag_id == "medreco_build", TaskInstance.run_id == run_id, TaskInstance.task_id.in_(stages)
            )
            .all()
        )
    out: dict[str, dict] = {}
    last_end = None
    for stage in stages:
        mine = [(q, a.timestamp(), b.timestamp()) for t, q, a, b in rows if t == stage and a and b]
        starts, ends = [a for _, a, _ in mine], [b for _, _, b in mine]
        waits = [a - q.timestamp() for q, a, _ in mine if q is not None]  # dag.test() queues nothing
        out[stage] = {
            "tasks": len(mine),
            "mean_task_s": round(sum(e - a for _, a, e in mine) / len(mine), 2),
            "wait_s": round(sum(waits) / len(waits), 2) if waits else 0.0,
            "spread_s": round(max(ends) - min(ends), 2),
        }
        if last_end is not None:
            out[stage]["gap_s"] = round(min(starts) - last_end, 2)
        last_end = max(ends)
    return out


def _db_run_id(summary_run_id: str) -> str:
    """The Airflow run id whose BuildContext run id is ``summary_run_id`` (the summary's is path-safe)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from etl.pipeline.context import safe_run_id

    with create_session() as session:
        for run in session.query(DagRun).filter(DagRun.dag_id == "medreco_build").order_by(DagRun.id.desc()):
            if safe_run_id(run.run_id) == summary_run_id:
                return run.run_id
    raise LookupError(f"no DAG run {summary_run_id}")


def speedup(
    archive_dir: str | Path,
    workers: int = 2,
    shard_count: int = 8,
    max_map_length: int | None = None,
    work_dir: str | Path | None = None,
    make_config: Callable[[Path], Path] | None = None,
) -> dict:
    """Build ``archive_dir`` serially and with ``workers`` LocalExecutor workers; compare the pixel stages.

    Parameters
    ----------
    archive_dir : str or Path
        a folder holding ``sources/<institution>/`` DICOM deliveries (each subfolder one institution of the
        config, reports ``none``); read in place, never written.
    workers : int
        worker processes of the second build (>= 2).
    shard_count : int
        patient-hash shards of both builds.
    max_map_length : int, optional
        mapped tasks per stage (default ``workers``: one task per worker and stage, so each task's start is paid
        once per worker; on the shared 2-core machine at load 5-7, 32 patients in 4 tasks per stage measured
        0.64x, 48 patients in 2 tasks 1.24x).
    work_dir : str or Path, optional
        where the two storage roots and the Airflow home go (default: a temporary folder, removed after).
    make_config : callable, optional
        ``make_config(root) -> config path`` for a fresh storage root ``root`` (e.g. ``bench_build.write_config``
        bound to its corpus and shard count, whose institutions carry reports); default: one institution per
        ``sources/`` subfolder, reports ``none``, ``shard_count`` and ``max_map_length`` as given.

    Returns
    -------
    dict
        ``speedup_pixel_stages`` (serial pixel seconds / parallel pixel seconds), ``pixel_s_serial``,
        ``pixel_s_workers``, ``build_s_serial``, ``build_s_workers`` (whole ``run_build`` calls, the
        scheduler's start and stop included), ``files`` (ledger files seen), ``workers``,
        ``timeline_serial``, ``timeline_workers`` (:func:`stage_timeline` of each run's pixel stages),
        ``process_ceiling`` (:func:`process_ceiling` right after the builds: what ``workers`` plain processes
        reached on this machine at that moment), ``load_1m_before``, ``load_1m_after`` (1-minute load averages
        around the two builds).

    Raises
    ------
    AssertionError
        when the two builds publish different content hashes.
    """
    if workers < 2:
        raise ValueError(f"compare with at least 2 workers, got {workers}")
    max_map_length = max_map_length or workers
    with tempfile.TemporaryDirectory(prefix="bench_workers_") as tmp:
        base = Path(work_dir or tmp)
        os.environ.setdefault("MEDRECO_PSEUDONYM_KEY", BENCH_KEY)
        from medreco.cli.embedded import prepare_airflow_env

        prepare_airflow_env(base / "airflow_home")
        from medreco.cli.embedded import run_build

        load_before = os.getloadavg()[0]
        out: dict = {"workers": workers}
        hashes = {}
        for label, n in (("serial", 1), ("workers", workers)):
            root = base / f"root_{label}"
            root.mkdir(parents=True)
            cfg = (
                make_config(root)
                if make_config is not None
                else _config(Path(archive_dir), root, shard_count, max_map_length)
            )
            t0 = time.perf_counter()
            summary = run_build(cfg, workers=n)
            out[f"build_s_{label}"] = round(time.perf_counter() - t0, 2)
            db_run = _db_run_id(summary["run_id"])
            out[f"pixel_s_{label}"] = round(_pixel_seconds(db_run), 2)
            out[f"timeline_{label}"] = stage_timeline(db_run)
            hashes[label] = summary["content_hash"]
            out["files"] = summary["ledger"]["files_seen"]
        out["process_ceiling"] = process_ceiling(workers)
        out["load_1m_before"], out["load_1m_after"] = round(load_before, 2), round(os.getloadavg()[0], 2)
        assert hashes["serial"] == hashes["workers"], f"content hashes differ: {hashes}"
        out["speedup_pixel_stages"] = round(out["pixel_s_serial"] / out["pixel_s_workers"], 2)
        return out


def main() -> int:
    patients = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    with tempfile.TemporaryDirectory(prefix="bench_workers_archive_") as tmp:
        archive = write_archive(Path(tmp), patients)
        r = speedup(
            archive,
            workers,
            max_map_length=int(os.environ.get("BENCH_MAX_MAP_LENGTH", 0)) or None,
            work_dir=os.environ.get("BENCH_WORK_DIR") or None,
        )
    keys = (
        "speedup_pixel_stages",
        "process_ceiling",
        "workers",
        "pixel_s_serial",
        "pixel_s_workers",
        "build_s_serial",
        "build_s_workers",
        "files",
        "load_1m_before",
        "load_1m_after",
    )
    for label in ("serial", "workers"):
        for stage, t in r[f"timeline_{label}"].items():
            print(f"  {label:7s} {stage:10s} " + " ".join(f"{k}={v}" for k, v in t.items()))
    print(f"BENCH workers {' '.join(f'{k}={r[k]}' for k in keys)} cores={os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
