"""The build lock: one build at a time per storage root (exclusive create on disk, conditional put on S3).

Two holders: a process (``medreco run``: :class:`BuildLock` with a heartbeat), and a DAG run (the build DAG's
first task takes it with :func:`acquire_for_run`, its last task, ``trigger_rule=all_done``, gives it back with
:func:`release_for_run`), so a scheduler-run build and an ``airflow dags test`` or a second trigger on the same
root never interleave: the second fails at its first task, naming the holder.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field

from etl.storage import put_if_absent, s3_client
from etl.zones import BUILD_LOCK
from schemas.errors import ReasonCodedError

#: seconds a lock stays valid without a heartbeat (the holder refreshes it every third of that)
BUILD_LOCK_TTL_S = 600.0
#: seconds a DAG run's lock stays valid (no process heartbeats it: the run's last task releases it, and a run
#: killed without reaching that task blocks the root for at most this long); ``$MEDRECO_DAG_LOCK_TTL_S``
DAG_LOCK_TTL_S = 24 * 3600.0
DAG_LOCK_TTL_ENV = "MEDRECO_DAG_LOCK_TTL_S"


class BuildLockHeldError(ReasonCodedError, RuntimeError):
    """Raised when another build holds the storage root's lock; ``holder`` is its lock record."""

    default_reason = "build_lock_held"
    message_format = "{message}"

    def __init__(self, uri: str, holder: dict) -> None:
        super().__init__(
            f"another build holds the lock {uri}: owner {holder.get('owner')!r} (host {holder.get('host')}, "
            f"pid {holder.get('pid')}), acquired {holder.get('acquired_at')}, expires {holder.get('expires_at')}; "
            "wait for it to finish, or remove the lock file if that process is gone"
        )
        self.holder = holder


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class BuildLock:
    """An exclusive lock on a storage root's build, held by one process (use as a context manager).

    The lock is the object :data:`BUILD_LOCK`, created only if absent: a hard link of a complete temporary
    file on local disk (``link`` is atomic on POSIX filesystems; not on NFS before v3), a conditional put
    (``If-None-Match: *``, boto3) on S3, which S3 has honoured since August 2024 (pyarrow's S3 filesystem cannot send
    it). Its record names the owner (the run), host, pid and an expiry; a heartbeat thread pushes the expiry
    forward every ``ttl_s / 3`` while the lock is held, so a holder killed without release blocks the root
    for at most ``ttl_s``, after which the next build takes the lock over.

    Limits: taking over an expired lock is a read-then-replace (on S3 a delete then a conditional put), so
    two processes that both find the same expired lock at the same instant are told apart only by the
    conditional create that follows: one wins, the other fails with :class:`BuildLockHeldError`.

    Parameters
    ----------
    storage : Storage
        the storage root (local or ``s3://``).
    owner : str
        who takes the lock (a run id or a label), shown to whoever is refused.
    ttl_s : float
        seconds the lock is valid without a heartbeat (default :data:`BUILD_LOCK_TTL_S`).
    endpoint_url, region : str, optional
        S3 endpoint (MinIO, moto) and region, as in the pipeline config.
    heartbeat : bool
        refresh the expiry from a daemon thread while held (default True).
    """

    storage: object
    owner: str
    ttl_s: float = BUILD_LOCK_TTL_S
    endpoint_url: str | None = None
    region: str = "us-east-1"
    heartbeat: bool = True
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: ``process`` (held while this process lives: a holder whose pid is dead on this host is taken over at
    #: once) or ``dag_run`` (held across the tasks of one DAG run, until its last task or the expiry)
    holder_kind: str = "process"
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    # ---- record -----------------------------------------------------------------------------
    def _record(self) -> bytes:
        now = _now()
        return json.dumps(
            {
                "owner": self.owner,
                "token": self.token,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "kind": self.holder_kind,
                "acquired_at": now.isoformat(timespec="milliseconds"),
                "expires_at": (now + dt.timedelta(seconds=self.ttl_s)).isoformat(timespec="milliseconds"),
            },
            sort_keys=True,
        ).encode()

    def holder(self) -> dict | None:
        """The current lock record, or None when the root is not locked."""
        if not self.storage.is_file(BUILD_LOCK):
            return None
        try:
            return json.loads(self.storage.read_bytes(BUILD_LOCK))
        except Exception:  # noqa: BLE001  gone meanwhile, or the empty record of a holder killed while creating it
            info = self.storage.fs.get_file_info(self.storage.path(BUILD_LOCK))
            if info.mtime is None:
                return None
            expires = info.mtime.astimezone(dt.UTC) + dt.timedelta(seconds=self.ttl_s)
            return {"owner": "unknown (unreadable lock record)", "expires_at": expires.isoformat(timespec="seconds")}

    @staticmethod
    def _dead(holder: dict) -> bool:
        """A process holder on this host whose pid no longer runs (or is a zombie): its lock is taken over at once."""
        pid = holder.get("pid")
        if holder.get("kind", "process") != "process" or holder.get("host") != socket.gethostname():
            return False
        if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        try:  # a killed process its parent has not reaped yet is a zombie (state Z): dead too
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X")
        except (OSError, IndexError):
            return False

    @staticmethod
    def _expired(holder: dict) -> bool:
        try:
            return dt.datetime.fromisoformat(holder["expires_at"]) < _now()
        except (KeyError, TypeError, ValueError):
            return False

    # ---- backend primitives -----------------------------------------------------------------
    def _bucket_key(self) -> tuple[str, str]:
        bucket, _, key = self.storage.path(BUILD_LOCK).partition("/")
        return bucket, key

    def _create(self, data: bytes) -> bool:
        """Create the lock object only if absent (:func:`etl.storage.put_if_absent`); True when this call created it."""
        return put_if_absent(self.storage, BUILD_LOCK, data)

    def _take_over(self, stale: dict) -> None:
        """Remove an expired lock (only if it is still the same record)."""
        if self.storage.is_local:
            path = self.storage.path(BUILD_LOCK)
            aside = f"{path}.stale-{uuid.uuid4().hex}"
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                return
            with open(aside, "rb") as f:
                moved = json.loads(f.read() or b"{}")
            if moved.get("token") != stale.get("token"):
                try:  # another process took the lock over in between: put its lock back
                    os.link(aside, path)
                except FileExistsError:
                    pass
            os.remove(aside)
            return
        current = self.holder()
        if current is not None and current.get("token") == stale.get("token"):
            bucket, key = self._bucket_key()
            s3_client(self.storage).delete_object(Bucket=bucket, Key=key)

    # ---- public ----------------------------------------------------------------------------
    def acquire(self) -> BuildLock:
        """Take the lock or fail at once.

        A lock whose record has expired, or whose holder is a process on this host that no longer runs, is taken
        over (the latter at once, not after the expiry).

        Raises
        ------
        BuildLockHeldError
            naming the holder, when another live build holds it.
        """
        for _ in range(3):
            if self._create(self._record()):
                if self.heartbeat:
                    self._thread = threading.Thread(target=self._beat, name="medreco-build-lock", daemon=True)
                    self._thread.start()
                return self
            holder = self.holder()
            if holder is None:
                continue  # released between our create and our read: try again
            if holder.get("token") == self.token:  # already ours (a retried DAG task): nothing to take
                return self
            if not self._expired(holder) and not self._dead(holder):
                raise BuildLockHeldError(self.storage.full_uri(BUILD_LOCK), holder)
            self._take_over(holder)
        raise BuildLockHeldError(self.storage.full_uri(BUILD_LOCK), self.holder() or {})

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            current = self.holder()
            if not current or current.get("token") != self.token:
                return  # lost (taken over after expiry): never overwrite another holder's record
            rec = json.loads(self._record())
            rec["acquired_at"] = current.get("acquired_at", rec["acquired_at"])
            self.storage.write_bytes(BUILD_LOCK, json.dumps(rec, sort_keys=True).encode())

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if this process still holds it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        current = self.holder()
        if current and current.get("token") == self.token:
            self.storage.delete(BUILD_LOCK)

    def __enter__(self) -> BuildLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def dag_run_token(run_id: str) -> str:
    """The lock token of one DAG run (the same for every task and retry of the run)."""
    import hashlib

    return "dagrun-" + hashlib.sha256(run_id.encode()).hexdigest()[:32]


def _dag_lock(storage, run_id: str, endpoint_url: str | None, region: str) -> BuildLock:
    ttl = float(os.environ.get(DAG_LOCK_TTL_ENV) or DAG_LOCK_TTL_S)
    return BuildLock(
        storage,
        owner=f"DAG run {run_id}",
        ttl_s=ttl,
        endpoint_url=endpoint_url,
        region=region,
        heartbeat=False,
        token=dag_run_token(run_id),
        holder_kind="dag_run",
    )


def acquire_for_run(
    storage, run_id: str, *, adopt_token: str | None = None, endpoint_url: str | None = None, region: str = "us-east-1"
) -> dict:
    """Take a storage root's build lock for one DAG run (the build DAG's first task).

    Parameters
    ----------
    storage : etl.storage.Storage
        the root.
    run_id : str
        the DAG run's id: the lock's token derives from it, so a retry of the task finds the lock its own.
    adopt_token : str, optional
        the token of a lock the caller of the run already holds (``medreco run`` takes the lock, then runs the DAG
        with ``dag.test()`` and passes its token in the run's conf): when the root's lock has that token, the
        run adopts it and leaves its release to that caller.
    endpoint_url, region : str, optional
        S3 endpoint and region.

    Returns
    -------
    dict
        ``{"owner", "adopted"}`` (PHI-free; for the task's XCom).

    Raises
    ------
    BuildLockHeldError
        naming the holder, when another build (a process or another DAG run) holds the lock.
    """
    lock = _dag_lock(storage, run_id, endpoint_url, region)
    holder = lock.holder()
    if adopt_token and holder is not None and holder.get("token") == adopt_token:
        return {"owner": holder.get("owner"), "adopted": True}
    lock.acquire()
    return {"owner": lock.owner, "adopted": False}


def release_for_run(storage, run_id: str, *, endpoint_url: str | None = None, region: str = "us-east-1") -> bool:
    """Give back the lock :func:`acquire_for_run` took for ``run_id`` (the build DAG's last task, run whatever
    the other tasks' states). True when it was held by the run and is now removed; False (nothing done) when
    another build holds it, or nobody does (a run refused at its first task, or one that adopted a lock)."""
    lock = _dag_lock(storage, run_id, endpoint_url, region)
    holder = lock.holder()
    if holder is None or holder.get("token") != lock.token:
        return False
    lock.release()
    return True
