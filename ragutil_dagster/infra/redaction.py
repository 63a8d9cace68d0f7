"""Keeping secrets out of logs, Dagster metadata and MLflow: credentials inside URIs (an MLflow
server's ``https://user:password@host``, a presigned ``?token=…`` / ``?X-Amz-Signature=…``) are
masked before any URI or parameter value is shown or stored."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
_SECRET_QUERY_KEYS = re.compile(
    r"token|secret|password|passwd|signature|sig|key|credential|auth", re.IGNORECASE
)
_URI = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def redact_uri(uri: str) -> str:
    """``uri`` with its password and secret-looking query values replaced by ``***``."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}" if ":" in userinfo else f"{MASK}@{host}"
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(_SECRET_QUERY_KEYS.search(k) for k, _ in pairs):
        query = urlencode(
            [(k, MASK if _SECRET_QUERY_KEYS.search(k) else v) for k, v in pairs], safe="*"
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return uri  # untouched, byte for byte (urlunsplit would normalise sqlite://// paths)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact(text: str) -> str:
    """``text`` with every URI in it passed through :func:`redact_uri`."""
    return _URI.sub(lambda m: redact_uri(m.group(0)), text)
