"""A ``DATABASE_URL`` as a Django ``DATABASES`` entry: dj-database-url, plus libpq's multi-host form."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import dj_database_url


def _multi_host_to_query(url: str) -> str:
    """``postgres://u@h1:p1,h2:p2/db?x`` -> ``postgres://u@/db?host=h1,h2&port=p1,p2&x``.

    libpq accepts both forms; dj-database-url only the second, and psycopg
    receives ``host``/``port`` lists either way.
    """
    parts = urlsplit(url)
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    if "," not in hostinfo:
        return url
    hosts, ports = [], []
    for item in hostinfo.split(","):
        if item.startswith("["):  # [ipv6]:port
            host, _, port = item[1:].partition("]")
            port = port.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        hosts.append(unquote(host))  # a percent-encoded socket directory
        ports.append(port)
    query = [("host", ",".join(hosts))]
    if any(ports):
        query.append(("port", ",".join(ports)))  # an empty entry: that host's default port, as in libpq
    query += parse_qsl(parts.query, keep_blank_values=True)
    return urlunsplit((parts.scheme, f"{userinfo}{at}", parts.path, urlencode(query, safe="/,"), parts.fragment))


def django_database(url: str, **overrides: Any) -> dict:
    """Django ``DATABASES`` entry for a PostgreSQL URL (``postgres[ql]://``).

    Parsing is dj-database-url's; ``host``/``port`` query parameters (a unix
    socket directory, or several hosts) become ``HOST``/``PORT``, other query
    parameters (sslmode, target_session_attrs, ...) stay in ``OPTIONS``.
    Keyword ``overrides`` are dj-database-url's (e.g. ``conn_max_age=600``).
    Raises ValueError naming DATABASE_URL for an empty or non-PostgreSQL URL.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("DATABASE_URL is empty; expected postgresql://user:password@host:port/dbname")
    url = url.strip()
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must be a postgres:// or postgresql:// URL (PostgreSQL 13+), got scheme {scheme or 'none'!r}")
    try:
        config = dj_database_url.parse(_multi_host_to_query(url), **overrides)
    except ValueError as exc:  # dj_database_url.ParseError is a ValueError
        raise ValueError(f"DATABASE_URL cannot be parsed: {exc}") from None
    options = config.get("OPTIONS") or {}
    for key in ("host", "port"):
        if key in options:
            config[key.upper()] = str(options.pop(key))
    if not config.get("NAME"):
        raise ValueError("DATABASE_URL must name a database (.../dbname)")
    config["OPTIONS"] = options
    return config
