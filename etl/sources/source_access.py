"""Access to an institution's source: is it there and readable, and every path under it.

A configured source that is missing (a typo in ``source_uri``) or that cannot be read must stop a build before any
work: an empty plan would otherwise balance (``files_seen=0``), publish an empty release and trigger training.
:func:`check_sources` is what ``medreco run`` and the build DAG's first work task call; it raises
:class:`SourceUnavailableError` naming the institution and the path:

- ``source_not_found``: nothing at the path (on object storage: no object under the prefix; an empty S3 source
  needs a folder marker object ``<prefix>/`` to count as existing);
- ``source_not_a_folder``: the path is a file;
- ``source_unreadable``: the folder cannot be listed (permissions, an unreachable bucket).

An existing, empty source is allowed (the run summary says "no files" for it).

:func:`list_source` lists every path under a source, including those that cannot be read as files: on local
disk a dangling symbolic link, a named pipe, socket or device, a folder that cannot be listed. Each comes back
with the reason it cannot be read; discovery gives it a ledger row (quarantined, ``unreadable_file``), so no
path under a source is left out of the ledger.
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass

import pyarrow.fs as pafs

from etl.storage import Storage, open_filesystem
from schemas.config import Institution, PipelineConfig
from schemas.errors import ReasonCodedError

#: the ledger reason of a path under a source that cannot be read as a file
UNREADABLE_REASON = "unreadable_file"


class SourceUnavailableError(ReasonCodedError, RuntimeError):
    """A configured institution's source is missing or unreadable (reasons ``source_not_found``,
    ``source_not_a_folder``, ``source_unreadable``); raised before any work."""


@dataclass(frozen=True)
class SourceEntry:
    """One path under a source.

    Attributes
    ----------
    rel : str
        the path relative to the source root.
    problem : str or None
        why it cannot be read as a file (a PHI-free phrase), None for a regular file.
    """

    rel: str
    problem: str | None = None


def source_storage(cfg: PipelineConfig, inst: Institution, root: Storage) -> Storage:
    """Storage for an institution's source, opened without creating anything (a missing source stays missing).

    A relative ``source_uri`` (a trusted config value, which may climb out of the root with ``..``, e.g. to
    ``../../../shared/data/dicom``) is resolved from the storage root.
    """
    uri = inst.source_uri
    if "://" in uri or uri.startswith("/"):
        fs, path = open_filesystem(uri, endpoint_url=cfg.storage.s3_endpoint_url, region=cfg.storage.s3_region)
        return Storage(fs=fs, root=path, uri=path if isinstance(fs, pafs.LocalFileSystem) else uri)
    if root.is_local:
        fs, path = open_filesystem(uri, base_dir=root.root)
        return Storage(fs=fs, root=path, uri=path)
    base = posixpath.normpath(f"{root.root}/{uri}")
    return Storage(fs=root.fs, root=base, uri=f"s3://{base}")


def check_source(inst: Institution, src: Storage) -> None:
    """Raise :class:`SourceUnavailableError` unless ``src`` (the source of ``inst``) is a readable folder.

    Raises
    ------
    SourceUnavailableError
        ``source_not_found``, ``source_not_a_folder`` or ``source_unreadable``, naming the institution, its
        configured ``source_uri`` and the resolved path.
    """
    where = f"institution {inst.id}: source_uri {inst.source_uri!r} ({src.uri})"
    if src.is_local:
        path = src.root
        if not os.path.exists(path):
            link = " is a link to nothing" if os.path.islink(path) else " does not exist"
            raise SourceUnavailableError("source_not_found", where + link)
        if not os.path.isdir(path):
            raise SourceUnavailableError("source_not_a_folder", where + " is a file, not a folder")
        try:
            with os.scandir(path) as it:
                next(it, None)
        except OSError as err:
            raise SourceUnavailableError(
                "source_unreadable", f"{where} cannot be listed ({type(err).__name__})"
            ) from None
        if not os.access(path, os.R_OK | os.X_OK):
            raise SourceUnavailableError("source_unreadable", where + " cannot be read (permissions)")
        return
    try:
        info = src.fs.get_file_info(src.root)
    except OSError as err:
        raise SourceUnavailableError("source_unreadable", f"{where} cannot be listed ({type(err).__name__})") from None
    if info.type == pafs.FileType.NotFound:
        raise SourceUnavailableError(
            "source_not_found", where + " holds no object (an empty source needs a folder marker object)"
        )
    if info.type == pafs.FileType.File:
        raise SourceUnavailableError("source_not_a_folder", where + " is an object, not a prefix")


def check_sources(cfg: PipelineConfig, root: Storage) -> dict[str, str]:
    """Check every configured institution's source (:func:`check_source`) before any work.

    Returns
    -------
    dict
        institution id -> resolved source URI.

    Raises
    ------
    SourceUnavailableError
        for the first institution (in config order) whose source is missing or unreadable.
    """
    out = {}
    for inst in cfg.institutions:
        src = source_storage(cfg, inst, root)
        check_source(inst, src)
        out[inst.id] = src.uri
    return out


def list_source(src: Storage) -> list[SourceEntry]:
    """Every path under a source, sorted: regular files, and (on local disk) what cannot be read as one.

    On local disk the tree is walked with ``os.scandir``, following links to folders: a dangling link, a link to
    a folder above it (a loop), a named pipe, socket or device, and a folder that cannot be listed come back
    with a ``problem``. On object storage every object is listed (a read that fails later is the caller's
    ``unreadable_file``).

    Returns
    -------
    list of SourceEntry
        sorted by ``rel``.
    """
    if not src.is_local:
        return [SourceEntry(rel) for rel in src.list_files()]
    out: list[SourceEntry] = []

    def walk(folder: str, prefix: str, above: frozenset[str] = frozenset()) -> None:
        real = os.path.realpath(folder)
        if real in above:
            out.append(SourceEntry(prefix.rstrip("/"), "a link to a folder above it (a loop)"))
            return
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as err:
            if prefix:  # the source root itself was checked by check_source
                out.append(SourceEntry(prefix.rstrip("/"), f"a folder that cannot be listed ({type(err).__name__})"))
            return
        for e in entries:
            rel = prefix + e.name
            try:
                if e.is_dir():
                    walk(e.path, rel + "/", above | {real})
                    continue
                if e.is_file():
                    out.append(SourceEntry(rel))
                    continue
                if e.is_symlink():
                    out.append(SourceEntry(rel, "a symbolic link to nothing"))
                    continue
                mode = e.stat(follow_symlinks=False).st_mode
                kind = "named pipe" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "device"
                out.append(SourceEntry(rel, f"not a regular file (a {kind})"))
            except OSError as err:
                out.append(SourceEntry(rel, f"cannot be inspected ({type(err).__name__})"))

    walk(src.root, "")
    return sorted(out, key=lambda e: e.rel)
