"""Per-record limits: how long and how large one input may be before it is quarantined instead of stalling a task.

A report, or one DICOM text value that goes through the text scrubber, longer than its cap is not processed at all
(reason ``value_too_long`` / ``report_too_long``), so no pattern ever runs on megabytes of text; the work on one
record (a DICOM file's de-identification, a report's de-identification) runs under :func:`time_limit`, which
stops it after a few seconds (reason ``deidentification_timeout`` / ``report_timeout``). Caps and limits are
module constants (the same for every deployment; changing one changes the build fingerprint through the code).

:func:`time_limit` interrupts with ``SIGALRM`` (``setitimer``), which also stops a regular expression in the
middle of a match (CPython checks signals inside the matcher). It arms only in the main thread and never
shortens or hides a timer that was already running (Airflow's ``execution_timeout`` uses the same signal):
where it cannot arm, the limit is checked when the work returns, and the caps bound the work in between.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from schemas.errors import ReasonCodedError

#: characters of one report's text (typical reports are a few thousand; Open-i's longest is under 4,000)
MAX_REPORT_CHARS = 50_000
#: characters of one DICOM text value that the descriptor scrubber cleans (LT holds 10,240; ST 1,024; LO 64)
MAX_DICOM_TEXT_CHARS = 10_240
#: seconds for one DICOM file's de-identification (read, walk, write, verify: well under a second normally)
FILE_TIME_LIMIT_S = 60.0
#: seconds for one report's de-identification and sectioning (milliseconds normally)
REPORT_TIME_LIMIT_S = 20.0


class RecordLimitError(ReasonCodedError, RuntimeError):
    """One record exceeded its time or size limit; ``reason`` is the quarantine reason code. The message
    names the limit, never a value."""

    message_format = "{message}"


@contextmanager
def time_limit(seconds: float, reason: str, what: str = "record") -> Iterator[None]:
    """Run the body with a time limit; raise :class:`RecordLimitError` ``reason`` when it runs longer.

    Parameters
    ----------
    seconds : float
        the limit.
    reason : str
        the reason code of the error (``deidentification_timeout``, ``report_timeout``).
    what : str
        what was limited, for the message.

    Raises
    ------
    RecordLimitError
        when the body ran longer than ``seconds`` (interrupted where the timer could be armed, else when it
        returned).
    """
    start = time.monotonic()
    armed = False
    old_handler = None

    def _expire(signum, frame):  # noqa: ARG001  signal handler signature
        raise RecordLimitError(reason, f"the {what} took longer than {seconds:g} s: stopped")

    if threading.current_thread() is threading.main_thread():
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        if remaining == 0.0 or remaining > seconds:  # never shorten or hide a timer already running
            try:
                old_handler = signal.signal(signal.SIGALRM, _expire)
                previous = signal.setitimer(signal.ITIMER_REAL, seconds)
                armed = True
            except (ValueError, OSError):  # not allowed here: fall back to the check after the body
                armed = False
    try:
        yield
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
            if previous[0]:  # give the outer timer back what is left of it
                signal.setitimer(signal.ITIMER_REAL, max(previous[0] - (time.monotonic() - start), 0.001), previous[1])
    if time.monotonic() - start > seconds:
        raise RecordLimitError(reason, f"the {what} took longer than {seconds:g} s")


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
