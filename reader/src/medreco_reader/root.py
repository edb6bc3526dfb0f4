"""Where a release lives: a local folder or ``s3://bucket/prefix``, opened read-only on :mod:`pyarrow.fs`.

The one implementation of opening a storage URI (the project's :mod:`etl.storage` uses it too) and of the
object_store ``storage_options`` that polars and deltalake need on S3.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs


class UnsupportedURIError(ValueError):
    """A storage URI that is neither a path, ``file://`` nor ``s3://bucket[/prefix]``."""


def s3_filesystem(endpoint_url: str | None = None, region: str = "us-east-1") -> pafs.S3FileSystem:
    """A pyarrow ``S3FileSystem``; ``endpoint_url`` (or ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``) points at an
    S3-compatible store (MinIO, moto). Credentials come from the standard AWS environment."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    kwargs: dict = {"region": region, "allow_bucket_creation": True}
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or parsed.path
        kwargs["scheme"] = parsed.scheme or "https"
    return pafs.S3FileSystem(**kwargs)


def open_filesystem(
    uri: str, *, endpoint_url: str | None = None, region: str = "us-east-1", base_dir: str | Path = "."
) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, base_path)`` for a local path, ``file://`` or ``s3://`` URI (relative paths from ``base_dir``).

    Raises
    ------
    UnsupportedURIError
        for another scheme or an ``s3://`` URI without a bucket.
    """
    parsed = urlparse(str(uri))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise UnsupportedURIError(f"S3 URI without a bucket: {uri!r}")
        path = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
        return s3_filesystem(endpoint_url, region), path
    if parsed.scheme in ("", "file"):
        local = Path(parsed.path if parsed.scheme == "file" else str(uri))
        if not local.is_absolute():
            local = Path(base_dir) / local
        return pafs.LocalFileSystem(), str(local.resolve())
    raise UnsupportedURIError(f"unsupported storage URI scheme {parsed.scheme!r} in {uri!r} (use a path or s3://)")


def storage_options(fs: pafs.FileSystem) -> dict[str, str] | None:
    """object_store ``storage_options`` (polars, deltalake) matching a pyarrow filesystem; None for local disk.

    For S3: region, endpoint (``aws_endpoint_url``, with ``aws_allow_http`` for ``http://`` endpoints) and
    explicit keys when the filesystem was given any, read from the filesystem's pickled constructor arguments.
    """
    if isinstance(fs, pafs.LocalFileSystem):
        return None
    reduced = fs.__reduce__()
    kwargs: dict[str, Any] = (
        reduced[1][0] if len(reduced) > 1 and reduced[1] and isinstance(reduced[1][0], dict) else {}
    )
    opts = {"aws_region": kwargs.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"}
    endpoint = (
        kwargs.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    )
    if endpoint:
        url = endpoint if "://" in endpoint else f"{kwargs.get('scheme') or 'https'}://{endpoint}"
        opts["aws_endpoint_url"] = url
        if url.startswith("http://"):
            opts["aws_allow_http"] = "true"
    for src, dst in (
        ("access_key", "aws_access_key_id"),
        ("secret_key", "aws_secret_access_key"),
        ("session_token", "aws_session_token"),
    ):
        if kwargs.get(src):
            opts[dst] = kwargs[src]
    return opts


@dataclass(frozen=True)
class Root:
    """Read-only access to files under one storage root (what a reader needs of the project's ``Storage``,
    which offers the same methods; every reader function accepts either).

    Parameters
    ----------
    fs : pyarrow.fs.FileSystem
    root : str
        base path on ``fs`` (S3: ``bucket/prefix``).
    uri : str
        what it was opened from (messages).
    """

    fs: pafs.FileSystem
    root: str
    uri: str

    @classmethod
    def open(cls, uri: str, *, endpoint_url: str | None = None, region: str = "us-east-1") -> Root:
        """Open a root without creating anything (see :func:`open_filesystem`)."""
        fs, base = open_filesystem(str(uri), endpoint_url=endpoint_url, region=region)
        return cls(fs, base, base if isinstance(fs, pafs.LocalFileSystem) else str(uri))

    @property
    def is_local(self) -> bool:
        """True for a local folder."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, rel: str) -> str:
        """Filesystem path of a root-relative path.

        Raises
        ------
        ValueError
            for a ``..``, ``.`` or NUL component (a path that could leave the root).
        """
        parts = [p for p in str(rel).split("/") if p]
        if any(p in (".", "..") or "\x00" in p for p in parts):
            raise ValueError("a path with a '..', '.' or NUL component was refused")
        return "/".join([self.root, *parts]) if parts else self.root

    def full_uri(self, rel: str) -> str:
        """Local path or ``s3://...`` URI of a root-relative path."""
        return self.path(rel) if self.is_local else "s3://" + self.path(rel)

    def exists(self, rel: str) -> bool:
        """True if a file or folder exists at ``rel``."""
        return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def is_file(self, rel: str) -> bool:
        """True if a file exists at ``rel``."""
        return self.fs.get_file_info(self.path(rel)).type == pafs.FileType.File

    def read_bytes(self, rel: str) -> bytes:
        """Whole content of a file as stored (no decompression by suffix).

        Raises
        ------
        FileNotFoundError
            when the file cannot be read.
        """
        try:
            with self.fs.open_input_stream(self.path(rel), compression=None) as f:
                return f.read()
        except OSError as err:
            raise self._unreadable(f"cannot read {self.full_uri(rel)}: {err}") from None

    def _unreadable(self, message: str) -> Exception:
        """The error :meth:`read_bytes` raises for a file it cannot read (a subclass may raise its own)."""
        return FileNotFoundError(message)

    def read_text(self, rel: str) -> str:
        """Read a UTF-8 text file (errors as :meth:`read_bytes`)."""
        return self.read_bytes(rel).decode("utf-8")
