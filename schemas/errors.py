"""The project's one reason-coded error.

Every stage error derives from :class:`ReasonCodedError`: ``reason`` is a machine-readable code (it becomes a
quarantine record's ``reason`` or a CLI exit message), ``detail`` the human message. Messages never quote a
value from an input file (a header value or report text may carry PHI); they name the file, element keyword
or field instead.

Subclasses also derive from the builtin that fits (``ValueError`` for bad input, ``RuntimeError`` for a state
of the system) and set :attr:`ReasonCodedError.message_format` to how ``str(err)`` reads. A subclass with one
reason sets :attr:`ReasonCodedError.default_reason` and is raised with its message alone.
"""

from __future__ import annotations


class ReasonCodedError(Exception):
    """An error with a machine-readable ``reason`` code.

    Parameters
    ----------
    reason : str
        the reason code, e.g. ``"truncated_file"``, ``"missing_column"``.
    message : str
        one line for a person; must not contain a value read from an input.

    Attributes
    ----------
    reason : str
    detail : str
        ``message`` as given.
    message_format : str
        class attribute, ``str.format`` pattern over ``reason`` and ``message`` (default ``"{reason}: {message}"``).
    """

    message_format = "{reason}: {message}"
    #: the reason of a subclass that has one (a state of the system rather than a per-input fault): such an error
    #: is raised with its message alone, ``StorageError("cannot read ...")``
    default_reason: str | None = None

    def __init__(self, reason: str, message: str | None = None) -> None:
        if message is None and self.default_reason is not None:
            reason, message = self.default_reason, reason
        message = message or ""
        super().__init__(self.message_format.format(reason=reason, message=message))
        self.reason = reason
        self.detail = message
