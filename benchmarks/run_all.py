"""Run every ``benchmarks/bench_*.py`` in its own process and collect the ``BENCH`` lines.

Each benchmark measures its baseline in the same run and ends with one line
``BENCH <name> <key>=<value> ...``; this runner prints those lines and exits non-zero if any failed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    here = Path(__file__).parent
    failed, lines = [], []
    for bench in sorted(here.glob("bench_*.py")):
        proc = subprocess.run([sys.executable, str(bench)], capture_output=True, text=True)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            failed.append(bench.name)
            sys.stderr.write(proc.stderr[-2000:])
        lines += [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")]
    print("\n".join(["", "summary:"] + lines))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
