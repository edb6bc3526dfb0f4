"""Who may use the curator app, from where, in which frame: authentication, Host/Origin checks, security headers.

Two ways in, both giving the curator identity every decision carries:

- ``medreco dashboard --serve``: :class:`TokenAuth`, a shared secret from ``$MEDRECO_REVIEW_TOKEN`` (at least
  :data:`MIN_TOKEN_CHARS` characters). A browser logs in with HTTP Basic: any curator name as user, the token as
  password (the name becomes the decision's curator); a script sends ``Authorization: Bearer <token>`` (curator
  ``token``). Without the variable the app does not start.
- The Airflow plugin: :func:`airflow_curator`, Airflow's own login (the API server's JWT, by bearer header or
  session cookie, checked by its auth manager), and the auth manager's permission on the custom view
  :data:`AIRFLOW_RESOURCE`; the Airflow user's name is the curator.

:class:`RequestGuard` refuses a request whose Host is not an allowed host name (a DNS-rebinding page reaches
the app under the attacker's name), a state-changing request without a same-origin ``Origin`` (or ``Referer``)
unless it carries an explicit bearer credential, and adds ``X-Frame-Options``, a Content-Security-Policy,
``X-Content-Type-Options`` and ``Referrer-Policy`` to every response.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import HTTPException, Request

from quality.review import CURATOR_RE
from schemas.errors import ReasonCodedError

TOKEN_ENV = "MEDRECO_REVIEW_TOKEN"
ALLOWED_HOSTS_ENV = "MEDRECO_REVIEW_ALLOWED_HOSTS"
MIN_TOKEN_CHARS = 16
#: custom-view resource name the Airflow auth manager is asked about
AIRFLOW_RESOURCE = "MedReCo curator review"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: an async function of the request returning the curator identity, raising HTTPException 401/403
Authenticator = Callable[[Request], Awaitable[str]]


class ReviewAuthError(ReasonCodedError, RuntimeError):
    """The served app cannot start safely: ``reason`` ``missing_review_token`` or ``weak_review_token``."""


def token_from_env() -> str:
    """The review token of ``$MEDRECO_REVIEW_TOKEN``.

    Raises
    ------
    ReviewAuthError
        ``missing_review_token`` when unset, ``weak_review_token`` when shorter than :data:`MIN_TOKEN_CHARS`.
    """
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise ReviewAuthError(
            "missing_review_token",
            f"set {TOKEN_ENV} (a secret of at least {MIN_TOKEN_CHARS} "
            "characters) to serve the review app: curators log in with it",
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ReviewAuthError("weak_review_token", f"{TOKEN_ENV} must have at least {MIN_TOKEN_CHARS} characters")
    return token


def _unauthorised(detail: str = "log in: a curator name and the review token") -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": 'Basic realm="MedReCo curator review"'})


@dataclass(frozen=True)
class TokenAuth:
    """Shared-token authentication of the served app (see the module docstring).

    Parameters
    ----------
    token : str
        the secret (:func:`token_from_env`).
    """

    token: str

    async def __call__(self, request: Request) -> str:
        """The curator identity of an authenticated request.

        Raises
        ------
        fastapi.HTTPException
            401 without valid credentials, 400 for a curator name that is not an identity (:data:`CURATOR_RE`).
        """
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer":
            if hmac.compare_digest(value.strip().encode(), self.token.encode()):
                return "token"
            raise _unauthorised()
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise _unauthorised() from None
            if not hmac.compare_digest(password.encode(), self.token.encode()):
                raise _unauthorised()
            if not CURATOR_RE.fullmatch(user):
                raise HTTPException(
                    400, "the user name must be a curator name (letters, digits, . _ @ + - and single spaces)"
                )
            return user
        raise _unauthorised()


async def airflow_curator(request: Request) -> str:
    """The Airflow user of a request to the plugin's routes, through the API server's auth manager.

    Raises
    ------
    fastapi.HTTPException
        401 without a valid Airflow login (no or an expired token), 403 for an invalid token or a user the auth
        manager does not allow on :data:`AIRFLOW_RESOURCE` (``GET`` to read, ``POST`` to record a decision).
    """
    user, allowed = await _airflow_user(request)
    if not allowed:
        raise HTTPException(403, "this Airflow user may not use the curator review")
    name = str(user.get_name() or "")
    if not CURATOR_RE.fullmatch(name):
        name = "airflow-user-" + re.sub(r"[^A-Za-z0-9]", "", str(user.get_id() or ""))[:40]
    return name


async def _airflow_user(request: Request):
    """``(user, allowed)`` from Airflow's login (the Airflow import lives here, where only the API server calls it)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPBearer

    credentials = await HTTPBearer(auto_error=False)(request)
    user = await get_user(request, None, credentials)  # 401/403 as for Airflow's own API
    method = "GET" if request.method in _SAFE_METHODS else "POST"
    return user, bool(
        get_auth_manager().is_authorized_custom_view(method=method, resource_name=AIRFLOW_RESOURCE, user=user)
    )


def allowed_hosts_from_env(extra: Iterable[str] = ()) -> frozenset[str]:
    """Host names the app answers to: the local names, ``extra`` and ``$MEDRECO_REVIEW_ALLOWED_HOSTS`` (comma
    separated), lowercase, without ports."""
    names = set(LOCAL_HOSTS) | {h for h in extra if h}
    names |= {h.strip() for h in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if h.strip()}
    return frozenset(h.lower().strip("[]") for h in names)


def _host_name(netloc: str) -> str:
    return (urlsplit("//" + netloc).hostname or "").lower()


@dataclass(frozen=True)
class RequestGuard:
    """Host and Origin checks and security headers (ASGI-free: the app calls :meth:`check` and :meth:`headers`).

    Parameters
    ----------
    allowed_hosts : frozenset of str
        host names (no port) the app answers to.
    frame_ancestors : str
        the CSP ``frame-ancestors`` source list: ``'none'`` (served app) or ``'self'`` (inside the Airflow UI's
        iframe); ``X-Frame-Options`` follows it (``DENY`` / ``SAMEORIGIN``).
    """

    allowed_hosts: frozenset[str]
    frame_ancestors: str = "'none'"

    def check(self, request: Request) -> None:
        """Refuse a request from an unexpected Host, or a cross-site or origin-less state-changing one.

        Raises
        ------
        fastapi.HTTPException
            403 (``Host`` not allowed; ``Origin``/``Referer`` missing or of another site on a POST without an
            explicit bearer credential).
        """
        host = request.headers.get("host", "")
        if _host_name(host) not in self.allowed_hosts:
            raise HTTPException(403, "unexpected Host header: refused (set MEDRECO_REVIEW_ALLOWED_HOSTS)")
        if request.method in _SAFE_METHODS:
            return
        if request.headers.get("authorization", "").lower().startswith("bearer "):
            return  # an explicit credential, never sent by a browser on its own: no cross-site forgery
        origin = request.headers.get("origin")
        if origin is None or origin == "null":
            referer = request.headers.get("referer")
            origin = None if not referer else f"{urlsplit(referer).scheme}://{urlsplit(referer).netloc}"
        if not origin or urlsplit(origin).netloc.lower() != host.lower():
            raise HTTPException(403, "cross-site or origin-less request refused")

    def headers(self, path: str) -> dict[str, str]:
        """Security headers for a response to ``path``: one strict CSP for the app's own pages and the static
        dashboard and Data Docs files alike (inline styles, images from the app or ``data:``, nothing else: the
        curator pages need no script and no other origin, so a browser would refuse any outbound load)."""
        frame = "DENY" if self.frame_ancestors == "'none'" else "SAMEORIGIN"
        csp = (
            f"default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; "
            f"base-uri 'none'; frame-ancestors {self.frame_ancestors}"
        )
        return {
            "X-Frame-Options": frame,
            "Content-Security-Policy": csp,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store",
        }
