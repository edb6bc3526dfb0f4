"""Per-record limits: how long and how large one input may be before it is quarantined instead of stalling a task.

A report, or one DICOM text value that goes through the text scrubber, longer than its cap is not processed at all
(reason ``value_too_long`` / ``report_too_long``), so no pattern ever runs on megabytes of text; the work on one
record (a DICOM file's de-identification, a report's de-identification) runs under :func:`time_limit`, which
stops it after a few seconds (reason ``deidentification_timeout`` / ``report_timeout``). Caps and limits are
module constants (the same for every deployment; changing one changes the build fingerprint through the code).

:func:`time_limit` counts the CPU time of the process (``ITIMER_PROF``, ``SIGPROF``), so whether a record is
quarantined does not depend on how loaded the machine is (a worker running several tasks, or a test run beside a
build: a file that needs 2 s of CPU takes 60 s of wall time at a load of 30 on one core), and a wall-clock backstop of
:data:`WALL_FACTOR` times the limit (``ITIMER_REAL``, ``SIGALRM``) for a body that waits without using CPU. Both
interrupt the body, which also stops a regular expression in the middle of a match (CPython checks signals inside
the matcher). They arm only in the main thread and never shorten or hide a timer that was already running
(Airflow's ``execution_timeout`` uses ``SIGALRM``; a profiler may use ``SIGPROF``): where one cannot arm, its limit is
checked when the work returns, and the caps bound the work in between.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from schemas.errors import ReasonCodedError

#: characters of one report's text (typical reports are a few thousand; Open-i's longest is under 4,000)
MAX_REPORT_CHARS = 50_000
#: characters of one DICOM text value that the descriptor scrubber cleans (LT holds 10,240; ST 1,024; LO 64)
MAX_DICOM_TEXT_CHARS = 10_240
#: CPU seconds for one DICOM file's de-identification (read, walk, write, verify: well under a second normally; a
#: radiograph or ultrasound read in full for burned-in text 0.3-3 s)
FILE_TIME_LIMIT_S = 60.0
#: CPU seconds for one report's de-identification and sectioning (milliseconds normally)
REPORT_TIME_LIMIT_S = 20.0
#: the wall-clock backstop of :func:`time_limit`, as a multiple of its CPU limit: it stops a body that waits (a
#: stalled read) without holding back one that shares its core with up to this many others
WALL_FACTOR = 10.0


class RecordLimitError(ReasonCodedError, RuntimeError):
    """One record exceeded its time or size limit; ``reason`` is the quarantine reason code. The message
    names the limit, never a value."""

    message_format = "{message}"


@contextmanager
def time_limit(seconds: float, reason: str, what: str = "record", wall_factor: float = WALL_FACTOR) -> Iterator[None]:
    """Run the body with a limit of ``seconds`` of CPU time; raise :class:`RecordLimitError` ``reason`` past it.

    Parameters
    ----------
    seconds : float
        the limit, in CPU seconds of this process (user + system, every thread: ``time.process_time``).
    reason : str
        the reason code of the error (``deidentification_timeout``, ``report_timeout``).
    what : str
        what was limited, for the message.
    wall_factor : float
        the wall-clock backstop, ``seconds * wall_factor`` seconds (a body that waits without using CPU).

    Raises
    ------
    RecordLimitError
        when the body used more than ``seconds`` of CPU or ran longer than the backstop (interrupted where the
        timers could be armed, else when it returned).
    """
    wall = seconds * wall_factor
    start, cpu_start = time.monotonic(), time.process_time()

    stopping = [False]

    def _expire(signum, frame):  # noqa: ARG001  signal handler signature
        if stopping[0]:  # fired as the body ended: the checks after it decide
            return
        limit = f"{seconds:g} s of CPU" if signum == signal.SIGPROF else f"{wall:g} s"
        raise RecordLimitError(reason, f"the {what} took longer than {limit}: stopped")

    armed = [
        _arm(signal.ITIMER_PROF, signal.SIGPROF, seconds, _expire),
        _arm(signal.ITIMER_REAL, signal.SIGALRM, wall, _expire),
    ]
    try:
        yield
    finally:
        stopping[0] = True  # from here no timer interrupts: both are stopped, then their handlers put back
        for timer in armed:
            if timer is not None:
                signal.setitimer(timer[0], 0)
        for timer in reversed(armed):
            if timer is not None:
                which, signum, old_handler, previous = timer
                _disarm(which, signum, old_handler, previous, time.process_time() - cpu_start, time.monotonic() - start)
    if time.process_time() - cpu_start > seconds:
        raise RecordLimitError(reason, f"the {what} took longer than {seconds:g} s of CPU")
    if time.monotonic() - start > wall:
        raise RecordLimitError(reason, f"the {what} took longer than {wall:g} s")


def _arm(which: int, signum: int, seconds: float, handler) -> tuple[int, int, Any, tuple[float, float]] | None:
    """Arm the interval timer ``which`` to deliver ``signum`` to ``handler`` after ``seconds``; None where it cannot
    (not the main thread, not allowed) or must not (a timer of that kind already running that ends sooner: it is
    neither shortened nor hidden). Returns (which, signum, the handler and timer it replaced)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    remaining, _ = signal.getitimer(which)
    if remaining != 0.0 and remaining <= seconds:
        return None
    try:
        old_handler = signal.signal(signum, handler)
        previous = signal.setitimer(which, seconds)
    except (ValueError, OSError):
        return None
    return which, signum, old_handler, previous


def _disarm(which: int, signum: int, old_handler, previous: tuple[float, float], used_cpu: float, used_wall: float):
    """Put back the handler of a timer :func:`_arm` armed (stopped by the caller) and give an outer timer what is left
    of it (in the timer's own clock: CPU time for ``ITIMER_PROF``, wall time for ``ITIMER_REAL``)."""
    signal.signal(signum, old_handler if old_handler is not None else signal.SIG_DFL)
    if previous[0]:
        used = used_cpu if which == signal.ITIMER_PROF else used_wall
        signal.setitimer(which, max(previous[0] - used, 0.001), previous[1])


def check_length(text: str, limit: int, reason: str, what: str) -> str:
    """Return ``text`` when it has at most ``limit`` characters.

    Raises
    ------
    RecordLimitError
        ``reason`` (``report_too_long``, ``value_too_long``) when it is longer; the message gives the two
        lengths, not the text.
    """
    if len(text) > limit:
        raise RecordLimitError(reason, f"the {what} has {len(text)} characters, more than the limit of {limit}")
    return text


#: bytes a Deflated Explicit VR Little Endian dataset may inflate to (a 1 MB file can inflate to gigabytes)
MAX_INFLATED_BYTES = 256 * 1024 * 1024
#: sequence items (item tags, at any depth, encapsulated pixel fragments included) one DICOM file may hold;
#: real enhanced multi-frame objects hold tens of thousands, a million empty items costs a minute to parse
MAX_SEQUENCE_ITEMS = 200_000
#: bytes one decoder call may produce (Rows x Columns x SamplesPerPixel x bytes per sample x frames decoded)
MAX_DECODED_BYTES = 1024 * 1024 * 1024
#: seconds one compressed image's decoding may take in the decoder worker before it is stopped
DECODE_TIME_LIMIT_S = 30.0
#: address space (bytes) the decoder worker may use beyond what it holds after start-up (RLIMIT_AS)
DECODER_MEMORY_BYTES = 3 * 1024 * 1024 * 1024
