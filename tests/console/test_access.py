"""The console's token, sessions, CSRF and host rule (mcplhost/console/access.py), pure, with time as a parameter."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcplhost.console.access import (
    MAX_FAILED_SIGNINS,
    MAX_SESSIONS,
    SESSION_TTL_S,
    SIGNIN_WINDOW_S,
    Gate,
    SigninLimiter,
    cleared_cookie,
    host_allowed,
    host_name,
    same_secret,
    session_cookie,
)

TOKEN = "0123456789abcdef0123456789abcdef"


class TestToken:
    @given(st.text(max_size=80), st.text(max_size=80))
    def test_same_secret_is_equality(self, given_: str, expected: str) -> None:
        """Whatever the two texts (any length, any characters), the answer is whether they are equal."""
        assert same_secret(given_, expected) == (given_ == expected)

    def test_only_the_token_signs_in(self) -> None:
        gate = Gate(TOKEN)
        assert gate.required
        assert gate.sign_in(TOKEN[:-1], 0) is None and gate.sign_in(TOKEN + " ", 0) is None
        session = gate.sign_in(TOKEN, 0)
        assert session is not None and TOKEN not in session
        assert gate.admitted(session, 1) and not gate.admitted(None, 1) and not gate.admitted("other", 1)

    def test_no_token_lets_everyone_in_and_signs_no_one_in(self) -> None:
        gate = Gate(None)
        assert not gate.required and gate.admitted(None, 0) and gate.sign_in("", 0) is None


class TestSessions:
    def test_a_session_ends_after_its_time_and_at_sign_out(self) -> None:
        gate = Gate(TOKEN)
        first, second = gate.sign_in(TOKEN, 0), gate.sign_in(TOKEN, 0)
        assert gate.admitted(first, SESSION_TTL_S - 1) and not gate.admitted(first, SESSION_TTL_S)
        gate.sign_out(second)
        assert not gate.admitted(second, 1)

    def test_sessions_are_bounded_the_oldest_forgotten(self) -> None:
        gate = Gate(TOKEN)
        sessions = [gate.sign_in(TOKEN, i) for i in range(MAX_SESSIONS + 1)]
        assert not gate.admitted(sessions[0], MAX_SESSIONS + 1)
        assert all(gate.admitted(s, MAX_SESSIONS + 1) for s in sessions[1:])


class TestCsrf:
    def test_a_session_s_forms_carry_its_own_token(self) -> None:
        """The CSRF token of one session does not pass for another, nor for no session."""
        gate = Gate(TOKEN)
        one, two = gate.sign_in(TOKEN, 0), gate.sign_in(TOKEN, 0)
        token = gate.csrf_for(one, 0)
        assert gate.csrf_ok(one, token, 0)
        assert not gate.csrf_ok(two, token, 0) and not gate.csrf_ok(None, token, 0)
        assert not gate.csrf_ok(None, gate.open_csrf, 0)  # with a token, the open one counts for nothing

    def test_an_open_console_has_one_token_of_its_own(self) -> None:
        gate = Gate(None)
        assert gate.csrf_for(None, 0) == gate.open_csrf and gate.csrf_ok(None, gate.open_csrf, 0)
        assert not gate.csrf_ok(None, "", 0) and Gate(None).open_csrf != gate.open_csrf


class TestSigninLimiter:
    def test_failures_are_bounded_per_window(self) -> None:
        limiter = SigninLimiter()
        for _ in range(MAX_FAILED_SIGNINS):
            assert limiter.open(0)
            limiter.failed(0)
        assert not limiter.open(SIGNIN_WINDOW_S - 0.001) and limiter.open(SIGNIN_WINDOW_S)


class TestHosts:
    @given(st.sampled_from(["127.0.0.1", "localhost", "[::1]", "127.1.2.3"]), st.integers(0, 65535))
    def test_a_loopback_console_answers_loopback_names(self, host: str, port: int) -> None:
        assert host_allowed(f"{host}:{port}", loopback=True) and host_allowed(host, loopback=True)

    @given(st.sampled_from(["attacker.example", "192.168.1.5", "[fe80::1]", "127.0.0.1.attacker.example", ""]))
    def test_and_nothing_else(self, host: str) -> None:
        assert not host_allowed(f"{host}:80", loopback=True) and host_allowed(f"{host}:80", loopback=False)
        assert not host_allowed(None, loopback=True)

    def test_host_name(self) -> None:
        assert [host_name(h) for h in ("a:1", "[::1]:2", "::1", "b")] == ["a", "::1", "::1", "b"]


class TestCookie:
    def test_http_only_and_same_site_strict(self) -> None:
        for cookie in (session_cookie("abc"), cleared_cookie()):
            assert "; HttpOnly" in cookie and "; SameSite=Strict" in cookie and "; Path=/" in cookie
        assert "Max-Age=0" in cleared_cookie()
