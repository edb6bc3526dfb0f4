"""How ``medreco --help`` reads: plain Click help (no Rich boxes, no ``<bool>`` placeholder on flags; Typer apps are
made with ``rich_markup_mode=None``) and usage lines in the POSIX convention, ``medreco deid [OPTIONS] SRC OUT``
(Typer 0.29 writes required arguments as ``{src}``): :func:`plain_usage` patches Typer's argument class once.
"""

from __future__ import annotations

from typer.core import TyperArgument


def _usage_display_name(self: TyperArgument) -> str:
    """``NAME`` for a required argument, ``[NAME]`` for an optional one, ``...`` after one that repeats."""
    name = self.metavar or self.name.upper()
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


def plain_usage() -> None:
    """Make every Typer argument show as ``NAME`` / ``[NAME]`` in usage lines (idempotent)."""
    TyperArgument._usage_display_name = _usage_display_name  # type: ignore[method-assign]
