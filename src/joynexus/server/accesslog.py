"""Keep API keys out of the server's logs.

Keys travel in the ``Authorization`` header, which no access log prints. A key put in
a URL's query (an old dashboard link ``/dashboard?key=jnx_...``, a hand-typed
``?api_key=``) would be printed by uvicorn's access log with the request line, so
:func:`install_access_log_redaction` adds :class:`RedactKeysFilter` to the
``uvicorn.access`` logger: every ``key=`` / ``api_key=`` / ``token=`` query value of a
record (its message and its arguments) is replaced by ``[redacted]`` before any handler
sees it. :func:`~joynexus.server.app.create_app` installs it; installing twice is a
no-op. Logger filters survive ``logging.config.dictConfig`` (uvicorn's own logging
setup replaces handlers, not filters).
"""

from __future__ import annotations

import logging
import re

__all__ = ["ACCESS_LOGGERS", "RedactKeysFilter", "install_access_log_redaction", "redact_keys"]

#: The loggers that print request lines.
ACCESS_LOGGERS = ("uvicorn.access",)

_SECRET_QUERY = re.compile(r"([?&;](?:key|api_key|apikey|token|access_token)=)[^&;#\s\"']*", re.I)
REDACTED = "[redacted]"


def redact_keys(text: str) -> str:
    """``text`` with the value of every ``key=`` (and similar) query parameter redacted."""
    return _SECRET_QUERY.sub(rf"\g<1>{REDACTED}", text)


class RedactKeysFilter(logging.Filter):
    """Redacts key-like query values in a record's message and arguments (keeps it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_keys(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact_keys(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {
                k: redact_keys(v) if isinstance(v, str) else v for k, v in record.args.items()
            }
        return True


def install_access_log_redaction(loggers: tuple[str, ...] = ACCESS_LOGGERS) -> None:
    """Add a :class:`RedactKeysFilter` to each named logger that has none yet."""
    for name in loggers:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeysFilter) for f in logger.filters):
            logger.addFilter(RedactKeysFilter())
