"""A fuzz campaign outside the test suite (issue 41): seeded mutants of real files, deflated and compressed seeds
included (tests/fuzz_dicom.py), plus the hand-made attacks of tests/hostile_dicom.py, through ``medreco deid``.

Reports: whether the run crashed, whether the ledger balances with one row per path, identifying values shipped
(the planted name parts and ID, raw and with case, spaces and separators ignored, in every output byte; the
attacks' MRN and accession number), the quarantine reasons, wall time and the peak RSS of the run (its decoder
worker included). Usage: ``python benchmarks/fuzz_campaign.py [N_FILES] [SEED]`` (default 1050 files, seed 4141).
Last line: ``BENCH fuzz_campaign k=v ...``.
"""

from __future__ import annotations

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
import hostile_dicom as h  # noqa: E402
from fuzz_dicom import PLANTED_BYTES, fuzz_corpus  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
ATTACKS = ("deflated_phi_in_model", "rle_panic", "jpeg_size_bomb", "j2k_size_bomb", "item_bomb", "deflate_bomb")


def folded(data: bytes) -> bytes:
    """Lower-case letters and digits of ``data`` only."""
    return bytes(b for b in data.lower() if chr(b).isalnum())


def main() -> None:
    """Build the corpus, run ``medreco deid`` on it once and print the report."""
    import pyarrow.parquet as pq

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1050
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 4141
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "out"
        made = fuzz_corpus(src, n, SHARED if SHARED.is_dir() else None, seed=seed)
        for name in ATTACKS:
            (src / f"attack-{name}.dcm").write_bytes(getattr(h, name)())
        paths = len(made) + len(ATTACKS)
        t0 = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "medreco.cli", "deid", str(src), str(out)],
            cwd=ROOT,
            env={"MEDRECO_PSEUDONYM_KEY": os.urandom(24).hex(), **os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        crashed = run.returncode != 0 or "Traceback" in run.stderr
        balance = json.loads(run.stdout.strip().splitlines()[-1]) if not crashed else {}
        rows = pq.read_table(out / "ledger.parquet").to_pylist() if (out / "ledger.parquet").is_file() else []
        shipped = 0
        files = list((out / "files").iterdir()) if (out / "files").is_dir() else []
        wanted = [*PLANTED_BYTES, h.MRN.encode(), h.ACCESSION.encode(), h.MRN[2:].encode()]
        for f in files:
            data = f.read_bytes()
            fold = folded(data)
            shipped += any(w in data or w.lower() in fold for w in wanted)
        reasons = Counter(f"{r['status']}:{r['reason']}" for r in rows)
        attacks = {
            r["source_uri"].rsplit("/", 1)[1]: f"{r['status']}:{r['reason']}"
            for r in rows
            if "/attack-" in r["source_uri"]
        }
    print(
        f"{paths} paths ({n} mutants of seed {seed}, {len(ATTACKS)} attacks); exit {run.returncode}; "
        f"{wall:.0f} s; peak RSS {rss / 2**20:.0f} MiB"
    )
    print("ledger:", json.dumps(balance, sort_keys=True))
    print("outcomes:", json.dumps(dict(reasons.most_common()), sort_keys=False))
    print("attacks:", json.dumps(attacks, sort_keys=True))
    if crashed:
        print(run.stderr[-3000:])
    print(
        f"BENCH fuzz_campaign paths={paths} rows={len(rows)} crashed={int(crashed)} "
        f"balanced={int(bool(balance.get('balanced')))} shipped_identifying={shipped} outputs={len(files)} "
        f"wall_s={wall:.0f} peak_rss_mib={rss / 2**20:.0f}"
    )


if __name__ == "__main__":
    main()
