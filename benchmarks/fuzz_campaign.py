"""A fuzz campaign outside the test suite (issue 41): seeded mutants of real files, deflated and compressed seeds
included (tests/fuzz_dicom.py), plus the hand-made attacks of tests/hostile_dicom.py, each de-identified alone
through the call ``medreco deid`` makes (:func:`medreco.cli.deid_folder.deidentify_folder`, one source folder of
one file per mutant).

Resumable: the corpus is written once under WORK (``WORK/corpus/``) and every mutant's result is appended as one
JSON line to ``WORK/results.jsonl`` (flushed and synced) as soon as it is done; a re-run with the same WORK skips
the mutants already there. Mutants run in a worker process; if the worker dies (a crash of the de-identification
itself, not a decoder worker's, which is contained) or makes no progress for :data:`HANG_S` seconds, the mutant
in flight is recorded as ``crashed`` / ``hung`` and a new worker goes on with the next one.

Per mutant: the outcome (status:reason), whether the call raised, whether its ledger balances with one row, the
output path the ledger names and whether it exists, identifying values shipped (the planted name parts and ID, the
attacks' MRN and accession number: raw and with case, spaces and separators ignored, in every output byte and in
every value of the output read back as a dataset, at any depth, binary values included), CPU and wall seconds,
and the peak RSS so far of the worker and of its decoder worker. The summary (``--report``, also printed at the
end) gives the totals, the slowest file and the peak RSS.

Usage: ``python benchmarks/fuzz_campaign.py [N_FILES] [SEED] [--work DIR] [--workers N]`` (default 1050 files,
seed 4141, WORK ``$TMPDIR/medreco-fuzz-<seed>-<n>``, one worker); ``--report`` summarises WORK without running.
Last line:
``BENCH fuzz_campaign k=v ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

SHARED = ROOT.parent / "shared" / "data"
ATTACKS = ("deflated_phi_in_model", "rle_panic", "jpeg_size_bomb", "j2k_size_bomb", "item_bomb", "deflate_bomb")
#: a worker that records nothing for this long is killed and its mutant recorded ``hung``
HANG_S = 900


def folded(data: bytes) -> bytes:
    """Lower-case letters and digits of ``data`` only."""
    return bytes(b for b in data.lower() if chr(b).isalnum())


def wanted() -> list[bytes]:
    """The identifying byte strings no output may hold."""
    import hostile_dicom as h
    from fuzz_dicom import PLANTED_BYTES

    return [*PLANTED_BYTES, h.MRN.encode(), h.ACCESSION.encode(), h.MRN[2:].encode(), h.ACCESSION[2:].encode()]


def _values(ds) -> list[bytes]:
    """Every value of ``ds`` at any depth as bytes (text encoded, binary as stored, file meta included)."""
    out = []
    datasets = [ds] + ([ds.file_meta] if getattr(ds, "file_meta", None) is not None else [])
    while datasets:
        d = datasets.pop()
        for elem in d.iterall() if hasattr(d, "iterall") else d:
            if elem.VR == "SQ":
                continue  # iterall walks the items
            v = elem.value
            vals = v if isinstance(v, (list, tuple)) or type(v).__name__ == "MultiValue" else [v]
            for x in vals:
                out.append(x if isinstance(x, (bytes, bytearray)) else str(x).encode("utf-8", "replace"))
    return out


def shipped(data: bytes, targets: list[bytes]) -> list[str]:
    """The targets found in an output's bytes or in its decoded values (case, spaces and separators ignored)."""
    import io
    import warnings

    import pydicom

    found = {t.decode() for t in targets if t in data or t.lower() in folded(data)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = pydicom.dcmread(io.BytesIO(data), force=True)
        values = _values(ds)
    except Exception as err:  # noqa: BLE001  an output that cannot be read back is itself a finding
        return sorted(found | {f"unreadable_output:{type(err).__name__}"})
    for v in values:
        f = folded(bytes(v))
        found |= {t.decode() for t in targets if t in v or t.lower() in f}
    return sorted(found)


def _peak_rss() -> dict:
    """Peak RSS (MiB) of this process and of the decoder worker it holds (VmHWM; 0 when none runs)."""
    from etl.pixels import contained

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    dec = 0.0
    proc = contained._worker.proc
    if proc is not None and proc.poll() is None:
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    dec = int(line.split()[1]) / 1024
        except OSError:
            pass
    return {"rss_mib": round(own, 1), "decoder_rss_mib": round(dec, 1)}


def _child_cpu() -> float:
    """CPU seconds of this process's finished children (Tesseract's runs)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def make_corpus(work: Path, n: int, seed: int) -> list[str]:
    """Write the corpus once (``WORK/corpus``, ``WORK/corpus.json`` lists it); returns the file names."""
    import hostile_dicom as h
    from fuzz_dicom import fuzz_corpus

    listing = work / "corpus.json"
    if listing.is_file():
        return json.loads(listing.read_text())
    corpus = work / "corpus"
    made = fuzz_corpus(corpus, n, SHARED if SHARED.is_dir() else None, seed=seed)
    names = [p.name for p, _ in made]
    for name in ATTACKS:
        (corpus / f"attack-{name}.dcm").write_bytes(getattr(h, name)())
        names.append(f"attack-{name}.dcm")
    listing.write_text(json.dumps(names))
    return names


def done_names(results: Path) -> set[str]:
    """Mutants already recorded in ``results``."""
    if not results.is_file():
        return set()
    out = set()
    for line in results.read_text().splitlines():
        try:
            out.add(json.loads(line)["name"])
        except (ValueError, KeyError):
            continue  # a line cut by a kill
    return out


def append(results: Path, record: dict) -> None:
    """Append one result line, flushed and synced."""
    with open(results, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def worker(work: Path, shard: int = 0, of: int = 1) -> None:
    """Run every mutant of this shard (the ``shard``-th of every ``of``) not yet recorded, one at a time, appending
    each result."""
    import pyarrow.parquet as pq

    from etl.keys import load_key
    from medreco.cli.deid_folder import deidentify_folder

    key = load_key(allow_airflow=False)
    targets = wanted()
    names = json.loads((work / "corpus.json").read_text())
    results, inflight = work / "results.jsonl", work / f"inflight-{shard}"
    done = done_names(results)
    for i, name in enumerate(names):
        if name in done or i % of != shard:
            continue
        inflight.write_text(name)
        one = Path(tempfile.mkdtemp(prefix="m-", dir=work))
        (one / "src").mkdir()
        os.link(work / "corpus" / name, one / "src" / name)
        record: dict = {"name": name, "kind": name.split("-", 1)[1].removesuffix(".dcm")}
        t0, c0, k0 = time.monotonic(), time.process_time(), _child_cpu()
        try:
            result = deidentify_folder(one / "src", one / "out", key)
            record["raised"] = None
        except BaseException as err:  # noqa: BLE001  a crash of the call is the finding
            if isinstance(err, KeyboardInterrupt):
                raise
            result, record["raised"] = {}, f"{type(err).__name__}: {str(err)[:200]}"
        record.update(wall_s=round(time.monotonic() - t0, 3), cpu_s=round(time.process_time() - c0, 3))
        record["child_cpu_s"] = round(_child_cpu() - k0, 3)  # Tesseract runs as a child process
        rows = (
            pq.read_table(one / "out" / "ledger.parquet").to_pylist() if (one / "out/ledger.parquet").is_file() else []
        )
        record["balanced"] = bool(result.get("balanced")) and len(rows) == 1 and result.get("files_seen") == 1
        record["outcome"] = f"{rows[0]['status']}:{rows[0]['reason']}" if len(rows) == 1 else f"rows={len(rows)}"
        outputs = sorted(p for p in (one / "out" / "files").glob("*") if p.is_file())
        record["outputs"] = len(outputs)
        if rows and "output" in rows[0]:  # the ledger names each output (OUT-relative path)
            named = [r["output"] for r in rows if r.get("output")]
            record["outputs_named"] = sorted(str(p.relative_to(one / "out")) for p in outputs) == sorted(named)
        record["shipped"] = sorted({t for p in outputs for t in shipped(p.read_bytes(), targets)})
        record.update(_peak_rss())
        append(results, record)
        for p in sorted(one.rglob("*"), key=lambda q: -len(q.parts)):
            p.unlink() if not p.is_dir() or p.is_symlink() else p.rmdir()
        one.rmdir()
    inflight.unlink(missing_ok=True)


def run(work: Path, workers: int = 1) -> None:
    """Run ``workers`` worker processes (each its share of the mutants) until every mutant is recorded; a dead or
    stuck worker's mutant is recorded ``crashed`` / ``hung`` and a new worker goes on with the next one."""
    names = json.loads((work / "corpus.json").read_text())
    results = work / "results.jsonl"
    env = {"MEDRECO_PSEUDONYM_KEY": os.urandom(24).hex(), **os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'reader/src'}"}
    shares = {k: {n for i, n in enumerate(names) if i % workers == k} for k in range(workers)}

    def start(k: int) -> subprocess.Popen:
        cmd = [sys.executable, __file__, "--worker", "--work", str(work), "--shard", str(k), "--of", str(workers)]
        return subprocess.Popen(cmd, cwd=ROOT, env=env)  # noqa: S603  our own script

    procs = {k: [start(k), time.monotonic(), -1] for k in range(workers)}
    while procs:
        time.sleep(5)
        done = done_names(results)
        for k, entry in list(procs.items()):
            proc, last, seen = entry
            left = shares[k] - done
            if proc.poll() is None:
                if len(left) != seen:
                    entry[1], entry[2] = time.monotonic(), len(left)
                    continue
                if time.monotonic() - last <= HANG_S:
                    continue
                proc.kill()
                proc.wait()
            if not left:
                del procs[k]
                continue
            inflight = work / f"inflight-{k}"
            name = inflight.read_text() if inflight.is_file() else None
            if name not in left:
                raise RuntimeError(f"worker {k} exited {proc.returncode} outside a mutant")
            how = "hung" if proc.returncode == -9 else "crashed"
            append(results, {"name": name, "kind": name.split("-", 1)[1].removesuffix(".dcm"), how: proc.returncode})
            procs[k] = [start(k), time.monotonic(), -1]


def report(work: Path, n: int, seed: int) -> None:
    """Summarise ``WORK/results.jsonl``."""
    names = json.loads((work / "corpus.json").read_text())
    recs = {}
    for line in (work / "results.jsonl").read_text().splitlines() if (work / "results.jsonl").is_file() else []:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        recs[r["name"]] = r
    rs = list(recs.values())
    crashed = [r["name"] for r in rs if r.get("crashed") is not None or r.get("raised")]
    hung = [r["name"] for r in rs if r.get("hung") is not None]
    unbalanced = [r["name"] for r in rs if "outcome" in r and not r["balanced"]]
    unnamed = [r["name"] for r in rs if r.get("outputs_named") is False]
    leaks = {r["name"]: r["shipped"] for r in rs if r.get("shipped")}
    timed = [r for r in rs if "wall_s" in r]
    slow = max(timed, key=lambda r: r["cpu_s"] + r.get("child_cpu_s", 0), default={})
    peak = max((r.get("rss_mib", 0) for r in rs), default=0)
    dpeak = max((r.get("decoder_rss_mib", 0) for r in rs), default=0)
    print(f"{len(rs)} of {len(names)} paths recorded ({n} mutants of seed {seed}, {len(ATTACKS)} attacks)")
    print("outcomes:", json.dumps(dict(Counter(r.get("outcome", "none") for r in rs).most_common())))
    print("attacks:", json.dumps({r["name"]: r.get("outcome") for r in rs if r["name"].startswith("attack-")}))
    print("crashed:", crashed, "hung:", hung, "unbalanced:", unbalanced, "outputs not named:", unnamed)
    print("shipped identifying values:", json.dumps(leaks))
    if slow:
        print(
            f"slowest file: {slow['name']} {slow['cpu_s']} CPU s (+{slow.get('child_cpu_s', 0)} in Tesseract), "
            f"{slow['wall_s']} wall s ({slow['outcome']})"
        )
    print(
        f"CPU s total {sum(r['cpu_s'] for r in timed):.0f} (+{sum(r.get('child_cpu_s', 0) for r in timed):.0f} in "
        f"children), wall s total {sum(r['wall_s'] for r in timed):.0f}"
    )
    print(
        f"BENCH fuzz_campaign paths={len(names)} recorded={len(rs)} crashed={len(crashed)} hung={len(hung)} "
        f"balanced={len(rs) - len(unbalanced) - len(crashed) - len(hung)} shipped_identifying={len(leaks)} "
        f"outputs={sum(r.get('outputs', 0) for r in rs)} peak_rss_mib={peak:.0f} decoder_peak_rss_mib={dpeak:.0f} "
        f"slowest_cpu_s={slow.get('cpu_s', 0)}"
    )


def main() -> None:
    """Parse the arguments; build the corpus, run the workers, print the report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", nargs="?", type=int, default=1050)
    ap.add_argument("seed", nargs="?", type=int, default=4141)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--workers", type=int, default=1, help="worker processes (each a share of the mutants)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--of", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--report", action="store_true", help="summarise WORK without running")
    a = ap.parse_args()
    work = a.work or Path(tempfile.gettempdir()) / f"medreco-fuzz-{a.seed}-{a.n}"
    if a.worker:
        worker(work, a.shard, a.of)
        return
    work.mkdir(parents=True, exist_ok=True)
    if not a.report:
        make_corpus(work, a.n, a.seed)
        run(work, a.workers)
    report(work, a.n, a.seed)


if __name__ == "__main__":
    main()
