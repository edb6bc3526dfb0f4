"""Per-institution ingestion check: has a new delivery arrived since the last one?

The ingestion DAG of an institution runs :func:`check_delivery` on its schedule; when the set of file
hashes changed, it emits the institution's source Asset, on which the build DAG is scheduled.
"""

from __future__ import annotations

import json

from etl import zones
from etl.pipeline.context import BuildContext
from etl.sources.discover import discover_institution


def delivery_state_path(institution: str) -> str:
    """Where the last seen delivery fingerprint of an institution is kept (restricted zone)."""
    return zones.delivery_state(institution)


def check_delivery(ctx: BuildContext, institution: str) -> dict:
    """Discover an institution's source and compare its content hashes with the last delivery seen.

    Returns
    -------
    dict
        ``{"institution", "files", "new_files", "removed_files", "changed"}``; the new state is stored
        only when it changed, so a re-run of an unchanged delivery is a no-op.
    """
    plan = discover_institution(ctx.cfg, ctx.cfg.institution(institution), ctx.storage, ctx.key)
    current = sorted(set(plan["sha256"].to_pylist()))
    path = delivery_state_path(institution)
    previous = json.loads(ctx.storage.read_text(path))["sha256"] if ctx.storage.is_file(path) else []
    new, removed = sorted(set(current) - set(previous)), sorted(set(previous) - set(current))
    changed = bool(new or removed)
    if changed:
        ctx.storage.write_text(path, json.dumps({"run_id": ctx.run_id, "sha256": current}))
    return {
        "institution": institution,
        "files": len(current),
        "new_files": len(new),
        "removed_files": len(removed),
        "changed": changed,
    }
