"""What one value of the config must be, beyond its type: names, grant patterns, wake entries, addresses, URLs.

Pure functions of a value (and the configured connectors' names), each
answering ``what is wrong`` without the value's path; mcplhost/config/rules.py
puts the path in front.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from ..store.open import is_database_url, redacted_url


def listen_address(listen: str) -> tuple[str, int]:
    """`[metrics] listen` or `[console] listen` as (host, port): `HOST:PORT`, an IPv6 host in brackets (`[::1]:9464`).

    Always both parts, so the address bound is the one written (docs/operations.md#metrics);
    ValueError saying what is wrong otherwise.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c in host for c in "[]/ ") or (":" in host and not listen.startswith("[")):
        raise ValueError(f"{listen!r} is not HOST:PORT (an IPv6 host in brackets: [::1]:9464)")
    if not (port.isascii() and port.isdigit() and int(port) < 65536):
        raise ValueError(f"{listen!r}: the port must be a number from 0 to 65535 (0: any free port, logged)")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether a `listen` host is reached from this machine only: `localhost`, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to anything


#: Names of connectors and agents (docs/agents.md#wakes): they appear in headers, tool names and log fields.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")


#: One segment of a grant pattern that is not `*`: a capability name (grants.py matches them literally).
_GRANT_SEGMENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


#: The `wake_on` keywords of docs/agents.md#scheduling; any other entry names a connector (NAME or NAME/GLOB).
WAKE_ON_KEYWORDS = ("all", "addressed", "dm", "push")


#: Why a well-formed grant pattern names no capability, or None when it names one. The capability
#: vocabulary belongs to the protocol layer, which sits above config (docs/architecture.md#layers), so
#: config never imports it: whoever loads a config for the host passes
#: `mcplhost.protocol.grants.unknown_grant_problem` in (mcplhost/cli/ does, for check-config and run), and its
#: answer is listed in place, as `connectors[i].grant[j]: ...`, with every other problem. Without it
#: only a pattern's form is checked.
UnknownGrant = Callable[[str], str | None]


def grant_pattern_problems(pattern: str, unknown_grant: UnknownGrant | None = None) -> list[str]:
    """What is wrong with a grant pattern: each segment is `*` or a name, and (with `unknown_grant`) it names a
    capability the host knows; the vocabulary is asked only about a pattern of the right form."""
    segments = pattern.split(".")
    if "" in segments:
        return [f"{pattern!r} has an empty segment"]
    bad = [s for s in segments if s != "*" and not _GRANT_SEGMENT.match(s)]
    if bad:
        return [f"{pattern!r}: segment {bad[0]!r} is neither * nor a capability name "
                "(* stands for exactly one segment; there is no ** or partial wildcard)"]
    unknown = unknown_grant(pattern) if unknown_grant is not None else None
    return [unknown] if unknown is not None else []


def wake_on_problems(entry: str, connector_names: set[str]) -> list[str]:
    """What is wrong with a `wake_on` entry: a keyword, a connector NAME, or NAME/GLOB."""
    if entry in WAKE_ON_KEYWORDS:
        return []
    name, slash, glob = entry.partition("/")
    if name in connector_names:
        return [f"{entry!r}: the channel glob after {name + '/'!r} is empty"] if slash and not glob else []
    choices = ", ".join(WAKE_ON_KEYWORDS)
    if slash:
        return [f"{entry!r}: no connector is named {name!r} (NAME/GLOB needs a configured connector)"]
    return [f"{entry!r} is not one of {choices}, nor a configured connector's name (or NAME/GLOB)"]


def hears_problems(entry: str, connector_names: set[str]) -> list[str]:
    """What is wrong with a `hears` entry: a configured connector's NAME, or NAME/CHANNEL-GLOB."""
    name, slash, glob = entry.partition("/")
    if name not in connector_names:
        return [f"{entry!r}: no connector is named {name!r}"]
    return [f"{entry!r}: the channel glob after {name + '/'!r} is empty"] if slash and not glob else []


def wake_from_problems(entry: str, connector_names: set[str]) -> list[str]:
    """What is wrong with a `wake_from` entry: NAME/AUTHOR-ID-GLOB, NAME a configured connector."""
    name, slash, glob = entry.partition("/")
    if not slash or not glob:
        return [f"{entry!r}: needs the form connector/author-id-glob (matched on the author's id)"]
    if name not in connector_names:
        return [f"{entry!r}: no connector is named {name!r}"]
    return []


def base_url_problem(url: str) -> str | None:
    """Why a backend's `base_url` cannot be used, or None.

    The SDKs' HTTP client refuses a URL with a control character, a port that
    is not a number or an unclosed `[` in its constructor (the backend is never
    built: a start or a reload fails on it); a URL that is not absolute
    http(s) with a host fails every call. Both are refused here, the way
    check-config refuses everything else it can see.
    """
    if any(not ch.isprintable() or ch.isspace() for ch in url):
        return f"{url!r} holds a space or a control character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading it is the check: a port outside 0-65535 or not a number raises
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an absolute http:// or https:// URL with a host (e.g. http://127.0.0.1:8000/v1)"
    return None


def store_url_problem(url: str) -> str | None:
    """Why `[store] url` (or `--db`) cannot name a PostgreSQL server, or None (the server is the start's to reach).

    libpq's URI form: postgresql:// or postgres://, then optionally user[:password]@host[:port]/database and
    ?key=value parameters (`host=/run/postgresql` names a Unix socket's folder). The answer shows the URL with its
    password replaced (`redact_url`).
    """
    if not is_database_url(url):
        return f"{redact_url(url)!r} is not a postgresql:// or postgres:// URL (an SQLite file is store.path)"
    try:
        urlsplit(url).port  # noqa: B018 - reading it is the check: a port outside 0-65535 or not a number raises
    except ValueError as exc:
        return f"{redact_url(url)!r} is not a URL ({exc})"
    if any(not ch.isprintable() or ch.isspace() for ch in url):
        return f"{redact_url(url)!r} holds a space or a control character (percent-encode it: %20)"
    return None


def redact_url(url: str) -> str:
    """`url` as a line may show it: as written when it holds no password, else the store's `redacted_url` (the
    password as ***); a URL too malformed for its password to be found in it shows its scheme alone."""
    if not url_passwords(url):
        return url
    try:
        return redacted_url(url)
    except ValueError:
        return url.partition("://")[0] + "://…"


def url_passwords(url: str) -> list[str]:
    """The passwords `url` holds (its user part's, any `password=` parameter's), each as written and decoded:
    the secrets of `[store] url` (mcplhost/config/environment.py)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return []
    authority, _slash, tail = _split_authority(rest)
    user, at, _host = authority.rpartition("@")
    written = [user.partition(":")[2]] if at and ":" in user else []
    written += [m[2] for m in _PASSWORD_PARAMETER.finditer(tail)]
    return sorted({form for value in written if value for form in (value, unquote(value))})


def _split_authority(rest: str) -> tuple[str, str, str]:
    """After the scheme: the authority (up to the first /, ? or #), the separator, and the rest."""
    match = re.search(r"[/?#]", rest)
    if match is None:
        return rest, "", ""
    return rest[: match.start()], rest[match.start()], rest[match.start() + 1:]


#: A `password=` query parameter (libpq reads it as the URL's password).
_PASSWORD_PARAMETER = re.compile(r"((?:^|[?&])password=)([^&#]*)")
