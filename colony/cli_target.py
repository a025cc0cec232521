"""Which HTTP API a `colony` command talks to, and with which token: `--url`/`$COLONY_URL` (a cluster
started elsewhere, e.g. the Kubernetes Service, with `--token`/`$COLONY_API_TOKEN`), else the local
cluster `colony up` started. The local cluster's token is sent only to the local cluster's address."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import httpx

from colony.config import ColonySettings, load_settings
from colony.errors import ApiError, ColonyError
from colony.wire.token import TOKEN_ENV, is_loopback

URL_ENV = "COLONY_URL"  # the API of a cluster started elsewhere (e.g. the Kubernetes Service)
__all__ = ["TOKEN_ENV", "URL_ENV", "ApiTarget", "api_error", "api_target", "remote_health"]


class ApiTarget:
    """Which API a command talks to and with which token: `--url`/`$COLONY_URL` (a cluster started
    elsewhere, with `--token`/`$COLONY_API_TOKEN`), else the local cluster `colony up` started, with
    the token it recorded (or `--token`)."""

    def __init__(self, url: str, token: str, *, remote: bool, local: Any = None) -> None:
        self.url, self.token, self.remote, self.local = url, token, remote, local

    @classmethod
    def of(cls, args: argparse.Namespace, settings: ColonySettings) -> ApiTarget | None:
        """None: no `--url` and no local cluster running."""
        from colony.serve import cluster

        url = getattr(args, "url", None) or os.environ.get(URL_ENV) or None
        given = getattr(args, "token", None) or None
        if url is None:  # the local cluster, with the token it recorded (not a $COLONY_API_TOKEN
            info = cluster.status(settings)  # exported for a cluster elsewhere), unless --token
            if info is None:
                return None
            return cls(info.url, given or info.token, remote=False, local=info)
        url = checked_url(url)
        token = given or os.environ.get(TOKEN_ENV) or None
        if token is None:  # the local cluster's token goes only to the local cluster's own address
            info = cluster.status(settings)
            if info is not None and same_address(info.url, url):
                return cls(url, info.token, remote=False, local=info)
        return cls(url, token or "", remote=True)


def same_address(a: str, b: str) -> bool:
    """Whether two API URLs name the same listener: scheme, port and path equal, and the same host
    or both loopback (`colony up` records 127.0.0.1; users type localhost)."""
    x, y = httpx.URL(a.rstrip("/")), httpx.URL(b.rstrip("/"))
    hosts_match = x.host == y.host or (is_loopback(x.host) and is_loopback(y.host))
    return hosts_match and (x.scheme, x.port, x.path) == (y.scheme, y.port, y.path)


def checked_url(url: str) -> str:
    """`--url`: an http(s) address with a host, and no credentials or query in it."""
    parsed = httpx.URL(url) if "://" in url else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ColonyError(f"--url {url!r}: give the API's address, e.g. http://colony.example:8000")
    if parsed.userinfo or parsed.query or parsed.fragment:
        raise ColonyError("--url: no user, password, query or fragment in the address (give --token)")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ColonyError(f"--url {url!r}: port {parsed.port} is not a TCP port (1-65535)")
    if parsed.scheme == "http" and not is_loopback(parsed.host):
        print(
            f"colony: warning: {parsed.host} is reached over plain http: the token travels unencrypted "
            "(use https, or a port-forward to localhost)",
            file=sys.stderr,
        )
    return str(parsed).rstrip("/")


def api_target(args: argparse.Namespace, settings: ColonySettings) -> ApiTarget:
    target = ApiTarget.of(args, settings)
    if target is None:
        raise ColonyError(
            "Colony is not running here; start it with `colony up`, or give the address of a cluster "
            f"started elsewhere with --url (or ${URL_ENV}) and its token with --token (or ${TOKEN_ENV})"
        )
    return target


def api_error(target: ApiTarget, exc: ColonyError) -> ColonyError:
    """An error of a call to `target`, with what to do when the token was refused."""
    from colony.client import ApiError

    if isinstance(exc, ApiError) and exc.status == 401:
        given = "the token given was refused" if target.token else "no token was given"
        return ColonyError(
            f"{exc} ({given}: pass the cluster's API token with --token or ${TOKEN_ENV}; on Kubernetes "
            "it is in the chart's token Secret, see docs/deploy.md)"
        )
    return exc


def remote_health(client: Any, target: ApiTarget) -> dict[str, Any]:
    """`/healthz` of a cluster started elsewhere (no token needed); an address where no Colony API
    answers is an error, a degraded one (Redis away) is reported."""
    from colony.client import ApiError

    try:
        health: dict[str, Any] = client.health()
    except ValueError:  # not JSON: some other web server
        raise ColonyError(f"{target.url} does not answer like a Colony API (/healthz is not JSON)") from None
    except httpx.HTTPError as exc:
        raise ColonyError(f"no Colony API answers at {target.url}: {exc or type(exc).__name__}") from None
    except ApiError as exc:
        if exc.status != 503:
            raise ColonyError(f"{target.url} does not answer like a Colony API: {exc}") from None
        return {"status": "degraded", "reason": str(exc)}
    if not isinstance(health, dict) or "status" not in health:
        raise ColonyError(f"{target.url} does not answer like a Colony API (its /healthz has no status)")
    return health


def server_text(value: Any, limit: int = 200) -> str:
    """Server text on one line for the terminal: printable characters only, bounded."""
    text = value if isinstance(value, str) else "" if value is None else str(value)
    shown = "".join(c if c.isprintable() else " " for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def call_api(args: argparse.Namespace, work: Callable[[Any], str | None]) -> int:
    """Run `work(client)` against the command's API target and print the text it returns (as it
    is when it ends its last line). An API refusal: its message on stderr, exit 1; a wrong token:
    the error naming where the token comes from."""
    target = api_target(args, load_settings(args.config))
    from colony.client import ColonyClient

    try:
        with ColonyClient(target.url, target.token) as client:
            shown = work(client)
    except ApiError as exc:
        if exc.status == 401:
            raise api_error(target, exc) from None
        print(f"colony: error: {exc}", file=sys.stderr)
        return 1
    if shown is not None:
        print(shown, end="" if shown.endswith("\n") else "\n")
    return 0


def target_of(args: argparse.Namespace) -> ApiTarget:
    """`api_target` with the settings of `args.config` (for a command that holds no client)."""
    return api_target(args, load_settings(getattr(args, "config", None)))
