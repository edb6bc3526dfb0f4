"""``python -m medreco.cli.warm_scheduler ARGS...``: ``airflow ARGS...`` in a process that has first loaded what every
build task loads again.

The LocalExecutor forks its worker processes from the scheduler, and each worker forks one task runner per task
(Airflow's task supervisor). A task runner of a cold scheduler imports the stage modules and builds the
per-process caches itself (the pipeline's modules, the de-identification policy of the config, the text
scrubber's word lists, the medspaCy pipeline: seconds to tens of seconds per task on a shared 2-core machine,
against a fraction of a second of work per demo shard), where ``dag.test()`` pays them once. Loaded here, before
the scheduler starts its executor, they are inherited by every worker and task runner (copy-on-write).

After warming, :func:`gc.freeze` moves everything loaded to the permanent generation, so the garbage
collections of the forked processes do not walk (and copy) it. Only imports and pure-Python caches are built (no pyarrow
or polars compute, so no native thread pool exists at the fork). The config is the one of ``$MEDRECO_CONFIG`` (the
run's).
"""

from __future__ import annotations

import gc
import os
import sys
import time


def warm(config_path: str | None = None) -> dict[str, float]:
    """Import the build's stage modules and fill the caches its tasks would fill per process.

    Parameters
    ----------
    config_path : str, optional
        the pipeline config whose ``deid`` options and institution languages are warmed (default
        ``$MEDRECO_CONFIG`` or the project's demo config).

    Returns
    -------
    dict
        seconds per step (``imports``, ``deid_policy``, ``lexicon``, ``extractors``).
    """
    from etl.pipeline.runtime import default_config_path, quiet_library_logs

    quiet_library_logs()
    took: dict[str, float] = {}
    t = time.perf_counter()
    import dags.medreco_build  # noqa: F401  the DAG file's imports
    import etl.deid.dicom  # noqa: F401
    import etl.pipeline.stages  # noqa: F401
    import etl.pixels.normalise  # noqa: F401
    import quality.gate  # noqa: F401

    took["imports"] = time.perf_counter() - t
    from schemas.config import load_config

    cfg = load_config(config_path or default_config_path())
    t = time.perf_counter()
    from etl.deid.policy import build_policy

    build_policy(cfg.deid)
    took["deid_policy"] = time.perf_counter() - t
    t = time.perf_counter()
    from entity_extraction.phi_lexicon import load_lexicon

    load_lexicon()
    took["lexicon"] = time.perf_counter() - t
    t = time.perf_counter()
    from etl.pipeline.stages import _extractor

    for language in sorted({i.language for i in cfg.institutions}):
        _extractor(language)
    took["extractors"] = time.perf_counter() - t
    return took


def main(argv: list[str] | None = None) -> None:
    """Warm this process, then run Airflow's command line with ``argv`` (default ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    took = warm(os.environ.get("MEDRECO_CONFIG"))
    # the loaded objects go to the permanent generation: the forked task runners' collections never walk them
    # (each walk would copy their pages out of the shared copy-on-write memory and cost CPU per collection)
    gc.freeze()
    print("medreco warm start: " + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()), flush=True)
    from airflow.__main__ import main as airflow_main

    sys.argv = ["airflow", *args]
    airflow_main()


if __name__ == "__main__":  # pragma: no cover
    main()
