"""The `medreco` console script: sub-commands registered, start-up stays light, demo's training summary."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from medreco.cli.app import _print_training, app


def test_every_documented_command_is_registered():
    out = CliRunner().invoke(app, ["--help"]).output
    for name in (
        "demo-corpus",
        "run",
        "demo",
        "deid",
        "reports",
        "eval",
        "snapshot",
        "train",
        "dashboard",
        "validate-source",
    ):
        assert name in out, name


def test_help_does_not_import_spacy_or_torch():
    code = (
        "import sys; import medreco.cli.app; "
        "print(sorted(m for m in ('spacy', 'torch', 'medspacy') if m in sys.modules))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )


def test_training_summary_prints_headline_metrics_not_per_entity_detail(capsys):
    record = {
        "snapshot_version": "0.2.0",
        "content_hash": "ab" * 32,
        "jobs": {
            "encoder": {
                "status": "succeeded",
                "lineage_record": {
                    "checkpoint": "/m/last.pt",
                    "metrics": {
                        "eval": {
                            "test": {
                                "micro": {"R@1": 0.5, "R@5": 1.0},
                                "by_entity": {"F029": {"R@1": 0.25}},
                                "n_queries": 4,
                            }
                        }
                    },
                },
            },
            "vlm": {"status": "failed", "lineage_record": None},
        },
    }
    _print_training(record)
    out = capsys.readouterr().out
    assert "training on snapshot 0.2.0 (content hash abababababababab)" in out
    assert "test.micro.R@1=0.500, test.micro.R@5=1.000, test.n_queries=4" in out
    assert "F029" not in out and "checkpoint /m/last.pt" in out
    assert "vlm      failed" in out


def _all_commands():
    import typer.main

    from medreco.cli.app import app

    root = typer.main.get_command(app)
    out, todo = [], [((), root)]
    while todo:
        path, cmd = todo.pop()
        subs = getattr(cmd, "commands", None)
        if subs:
            todo += [((*path, name), sub) for name, sub in subs.items()]
        else:
            out.append(path)
    return sorted(out)


def test_help_is_plain_with_posix_usage_lines():
    from typer.testing import CliRunner

    from medreco.cli.app import app

    commands = _all_commands()
    assert ("deid",) in commands and ("snapshot", "export") in commands and len(commands) > 12
    runner = CliRunner()
    for path in commands:
        out = runner.invoke(app, [*path, "--help"], terminal_width=100).output
        assert "<bool>" not in out and "╭" not in out, path  # no placeholder on flags, no boxes
        assert "{" not in out.splitlines()[0], path  # usage line: NAME, not {name}
    usage = runner.invoke(app, ["deid", "--help"]).output.splitlines()[0]
    assert usage.endswith(" deid [OPTIONS] SRC OUT")  # the program name is "root" under CliRunner
