"""Where the service's bearer token comes from, what counts as a local address, and what is an http(s) URL.

Shared by the CLI (client and ``rayprof serve``) and the service replicas.
An empty token is a configuration error, never "no auth": a variable set to
"" is a mistake to report, not a way to open the service.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.errors import ConfigurationError
from orchestrator.settings import (
    ALLOWED_HOSTS_ENV_VAR,
    DEFAULT_ALLOWED_HOSTS,
    TOKEN_ENV_VAR,
    TOKEN_FILE_ENV_VAR,
)

__all__ = ["MIN_TOKEN_LENGTH", "allowed_hosts", "check_exposure", "host_of", "is_loopback", "read_token"]

MIN_TOKEN_LENGTH = 16
"""Shorter tokens are refused: one signed link lets anyone guess a token offline, as fast as they can hash."""

# A bearer token is sent in a header: visible ASCII only (RFC 6750 allows less).
_TOKEN = re.compile(r"^[\x21-\x7e]{1,4096}$")
_WILDCARD_BINDS = ("0.0.0.0", "::", "")


def read_token(token: str | None = None, token_file: str | os.PathLike[str] | None = None) -> str | None:
    """The bearer token, or ``None`` when none is configured anywhere.

    ``token`` or ``token_file`` when given; else ``RAYPROF_TOKEN_FILE`` (a file
    holding the token), else ``RAYPROF_TOKEN``. Raises :class:`ConfigurationError`
    for an empty token, an empty or unreadable file, or both variables set.
    """
    if token is not None:
        return _checked(token, "the token given")
    if token_file is not None:
        return _from_file(Path(token_file), "the token file")
    from_file = os.environ.get(TOKEN_FILE_ENV_VAR)
    from_env = os.environ.get(TOKEN_ENV_VAR)
    if from_file is not None and from_env is not None:
        raise ConfigurationError(f"both {TOKEN_FILE_ENV_VAR} and {TOKEN_ENV_VAR} are set; set only one")
    if from_file is not None:
        if not from_file:
            raise ConfigurationError(f"{TOKEN_FILE_ENV_VAR} is set but empty; name a file or unset it")
        return _from_file(Path(from_file), TOKEN_FILE_ENV_VAR)
    if from_env is not None:
        return _checked(from_env, TOKEN_ENV_VAR)
    return None


def _from_file(path: Path, source: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigurationError(f"cannot read the token from {path} ({source}): {e.__class__.__name__}") from None
    return _checked(text.strip(), f"{source} {path}")


def _checked(token: str, source: str) -> str:
    if token == "":
        raise ConfigurationError(
            f"{source} is empty; an empty token never means 'no auth': set a token or unset it"
        )
    if not _TOKEN.match(token):
        raise ConfigurationError(f"{source} holds characters a bearer token cannot have (whitespace or non-ASCII)")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{source} is {len(token)} characters; a token needs at least {MIN_TOKEN_LENGTH} "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a Host name) only reaches this machine."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_http_url(url: str) -> bool:
    """Whether ``url`` is ``http(s)://HOST[:PORT]...`` (a service or S3 endpoint a user typed): "localhost:8000"
    parses as scheme "localhost", "http://[" and a port out of range make urllib raise."""
    try:
        parsed = urlparse(url)
        return parsed.scheme in ("http", "https") and bool(parsed.hostname) and parsed.port != 0
    except ValueError:
        return False


def check_exposure(host: str | None, token: str | None, *, insecure: bool) -> None:
    """Refuse to serve on a non-loopback address without a token unless ``insecure``.

    ``host`` is the address Serve binds (``None`` when it cannot be known).
    """
    if host is None or token is not None or insecure or is_loopback(host):
        return
    where = "every interface" if host in _WILDCARD_BINDS else host
    raise ConfigurationError(
        f"the rayprof service would listen on {where} with no token: anyone who can reach it could start "
        f"profiles and read traces. Set a token ({TOKEN_FILE_ENV_VAR}=/path/to/file, {TOKEN_ENV_VAR}, "
        "rayprof serve --token-file, or the app arg 'token'), bind 127.0.0.1, or accept the risk with "
        "rayprof serve --insecure (app arg 'insecure: true')"
    )


def allowed_hosts(extra: list[str] | tuple[str, ...] = ()) -> frozenset[str]:
    """Host names an unauthenticated service answers: loopback, ``extra``, and ``RAYPROF_ALLOWED_HOSTS``."""
    configured = [h for h in os.environ.get(ALLOWED_HOSTS_ENV_VAR, "").split(",") if h.strip()]
    return frozenset(host_of(h) for h in (*DEFAULT_ALLOWED_HOSTS, *extra, *configured))


def host_of(header: str) -> str:
    """The host of a ``Host`` header value, without port, brackets or trailing dot, lower case."""
    value = header.strip().lower()
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else value[1:]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")
