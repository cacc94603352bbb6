"""Who may see the console and ask it to act: the token, sessions, CSRF, hosts (docs/operations.md#console).

All pure or in memory, no I/O and no clock of their own (`now` is passed):

- `Gate` holds the token (or none: a loopback console without one is open
  to this machine's users) and the sessions it signed in. The token is
  compared in constant time, as SHA-256 digests so not even its length
  leaks; a session is a random id the browser keeps in an HttpOnly,
  SameSite=Strict cookie, never the token itself.
- Every form that acts carries a CSRF token: the session's own, or the
  console's when no sign-in is needed; `Gate.csrf_ok` checks it in
  constant time.
- `host_allowed`: a loopback console answers only requests that name a
  loopback host, so a page of another site whose name resolves to
  127.0.0.1 (DNS rebinding) cannot read it.
- `SigninLimiter`: failed sign-ins per minute are bounded, so the token
  cannot be guessed at the speed of the network.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict, deque

import msgspec

from mcplhost.config import is_loopback

#: The session cookie's name.
COOKIE = "mcplhost_console"
#: How long a sign-in lasts.
SESSION_TTL_S = 12 * 3600
#: Sessions held at once; signing in past this forgets the oldest.
MAX_SESSIONS = 64
#: Failed sign-ins accepted per `SIGNIN_WINDOW_S`; past it every sign-in is refused until the window moves on.
MAX_FAILED_SIGNINS = 10
SIGNIN_WINDOW_S = 60.0
#: Random bytes in a session id and in a CSRF token.
RANDOM_BYTES = 32


class Session(msgspec.Struct, frozen=True):
    csrf: str
    expires: float  # on the caller's clock


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def same_secret(given: str, expected: str) -> bool:
    """Whether `given` is `expected`, in time that depends on neither (digests of equal length compared)."""
    return hmac.compare_digest(_digest(given), _digest(expected))


class Gate:
    """The console's token and its signed-in sessions; with no token every visitor is let in."""

    def __init__(self, token: str | None) -> None:
        self._token = token
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        #: The CSRF token of forms when no sign-in is needed (a loopback console without a token).
        self.open_csrf = secrets.token_urlsafe(RANDOM_BYTES)

    @property
    def required(self) -> bool:
        """Whether visitors must sign in."""
        return self._token is not None

    def sign_in(self, given: str, now: float) -> str | None:
        """A new session id when `given` is the token, else None."""
        if self._token is None or not same_secret(given, self._token):
            return None
        self._forget_expired(now)
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.popitem(last=False)
        session_id = secrets.token_urlsafe(RANDOM_BYTES)
        self._sessions[session_id] = Session(csrf=secrets.token_urlsafe(RANDOM_BYTES), expires=now + SESSION_TTL_S)
        return session_id

    def sign_out(self, session_id: str | None) -> None:
        if session_id is not None:
            self._sessions.pop(session_id, None)

    def session(self, session_id: str | None, now: float) -> Session | None:
        """The live session `session_id` names (None: none, or expired)."""
        if session_id is None:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if session.expires <= now:
            del self._sessions[session_id]
            return None
        return session

    def admitted(self, session_id: str | None, now: float) -> bool:
        """Whether a request with this cookie value may see the console."""
        return not self.required or self.session(session_id, now) is not None

    def csrf_for(self, session_id: str | None, now: float) -> str:
        """The CSRF token the forms of this visitor's pages carry."""
        session = self.session(session_id, now)
        return session.csrf if session is not None else self.open_csrf

    def csrf_ok(self, session_id: str | None, given: str, now: float) -> bool:
        """Whether a form's CSRF token is this visitor's (a signed-in visitor's own when sign-in is required)."""
        if self.required:
            session = self.session(session_id, now)
            return session is not None and same_secret(given, session.csrf)
        return same_secret(given, self.open_csrf)

    def _forget_expired(self, now: float) -> None:
        for session_id in [key for key, session in self._sessions.items() if session.expires <= now]:
            del self._sessions[session_id]


class SigninLimiter:
    """At most MAX_FAILED_SIGNINS failures in any SIGNIN_WINDOW_S; `now` on the caller's clock."""

    def __init__(self, allowance: int = MAX_FAILED_SIGNINS, window_s: float = SIGNIN_WINDOW_S) -> None:
        self.allowance = allowance
        self.window_s = window_s
        self._failures: deque[float] = deque()

    def open(self, now: float) -> bool:
        """Whether a sign-in may be tried now."""
        while self._failures and self._failures[0] <= now - self.window_s:
            self._failures.popleft()
        return len(self._failures) < self.allowance

    def failed(self, now: float) -> None:
        self._failures.append(now)


def host_name(header: str) -> str:
    """The host part of a Host header (`127.0.0.1:8787` → `127.0.0.1`, `[::1]:8787` → `::1`)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def host_allowed(header: str | None, *, loopback: bool) -> bool:
    """Whether a request naming Host `header` is answered: any by a console that needs its token, only a
    loopback name by a loopback console (a rebinding page's own name is refused)."""
    if not loopback:
        return True
    return header is not None and is_loopback(host_name(header))


def session_cookie(session_id: str, *, max_age: int = SESSION_TTL_S) -> str:
    """The Set-Cookie value: HttpOnly (no script reads it), SameSite=Strict (no other site's request carries it)."""
    return f"{COOKIE}={session_id}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict"


def cleared_cookie() -> str:
    return f"{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
