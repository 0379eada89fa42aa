"""Keep API keys, and the raw control characters of a request, out of the server's logs.

Keys travel in the ``Authorization`` header, which no access log prints. A key put in
a URL's query (an old dashboard link ``/dashboard?key=jnx_...``, a hand-typed
``?api_key=``) would be printed by uvicorn's access log with the request line, so
:func:`install_access_log_redaction` adds :class:`RedactKeysFilter` to the
``uvicorn.access`` logger: every ``key=`` / ``api_key=`` / ``token=`` query value of a
record (its message and its arguments) is replaced by ``[redacted]`` before any handler
sees it. :func:`~joynexus.server.app.create_app` installs it; installing twice is a
no-op. Logger filters survive ``logging.config.dictConfig`` (uvicorn's own logging
setup replaces handlers, not filters).

A request's path reaches the logs as the client sent it (uvicorn's access line) or
decoded (the error log names the path that failed), where ``%0A`` is a newline that
starts a forged line and ``%1B[2J`` drives the operator's terminal. The same filter, on the
request loggers of the model process and of the front processes (:data:`LOGGERS`), writes
every control character of a record's string arguments as a ``\\xNN`` escape
(:func:`escape_controls`).
"""

from __future__ import annotations

import logging
import re

__all__ = [
    "ACCESS_LOGGERS",
    "LOGGERS",
    "RedactKeysFilter",
    "escape_controls",
    "install_access_log_redaction",
    "redact_keys",
]

#: The loggers that print request lines.
ACCESS_LOGGERS = ("uvicorn.access",)
#: Every logger whose records may quote a request's path or query.
LOGGERS = (
    *ACCESS_LOGGERS,
    "uvicorn.error",
    "joynexus.server",
    "joynexus.server.front",
    "joynexus.server.openpi.gateway",
)
#: C0 controls, DEL and the C1 controls (which some terminals obey too).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

_SECRET_QUERY = re.compile(r"([?&;](?:key|api_key|apikey|token|access_token)=)[^&;#\s\"']*", re.I)
REDACTED = "[redacted]"


def redact_keys(text: str) -> str:
    """``text`` with the value of every ``key=`` (and similar) query parameter redacted."""
    return _SECRET_QUERY.sub(rf"\g<1>{REDACTED}", text)


def escape_controls(text: str) -> str:
    """``text`` with every control character written as ``\\xNN`` (``"a\\nb"`` → ``a\\x0ab``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _clean(value: str) -> str:
    return escape_controls(redact_keys(value))


class RedactKeysFilter(logging.Filter):
    """Redacts key-like query values in a record's message and arguments, and escapes
    the control characters of its string arguments (keeps the record). The message
    itself is the code's own format string: its newlines stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_keys(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_clean(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {
                k: _clean(v) if isinstance(v, str) else v for k, v in record.args.items()
            }
        return True


def install_access_log_redaction(loggers: tuple[str, ...] = LOGGERS) -> None:
    """Add a :class:`RedactKeysFilter` to each named logger that has none yet."""
    for name in loggers:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeysFilter) for f in logger.filters):
            logger.addFilter(RedactKeysFilter())
