"""A connector's `env_file`: KEY=VALUE lines the host reads at each spawn (docs/operations.md#connector-environments-and-secrets);
and the console's `token_file` (docs/operations.md#console), kept the same way.

The syntax, the whole of it:

- one assignment per line, ``NAME=VALUE``; NAME is a shell-style variable
  name (``[A-Za-z_][A-Za-z0-9_]*``); spaces around NAME and VALUE are dropped;
- blank lines, and lines whose first non-blank character is ``#``, are skipped
  (a ``#`` later in a line is part of the value: tokens may hold one);
- a VALUE that begins and ends with the same quote (``"`` or ``'``) loses
  that outer pair and keeps everything between as written, spaces included;
- nothing is special inside a value: no ``$VAR`` expansion, no backslash
  escapes, no command substitution, no line continuation;
- a NAME given twice is an error (which one was meant is a guess).

The file must be a regular file that neither group nor others may read or
write (mode 0600 or stricter): it holds secrets. Errors name the line, never
its text, since the text may be a secret.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

#: More than this is not a list of a connector's variables; reading stops there.
ENV_FILE_MAX_BYTES = 64 * 1024
#: Permission bits that refuse the file: readable or writable by the group or by others.
SHARED_BITS = stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH
#: A variable name, as the shell and systemd's EnvironmentFile= accept it.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
QUOTES = ('"', "'")


class EnvFileError(Exception):
    """The env file cannot be used; the message says why (never a value from it)."""


def parse_env_file(text: str) -> dict[str, str]:
    """The assignments of an env file's text; EnvFileError naming the first bad line."""
    found: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, equals, value = stripped.partition("=")
        name, value = name.strip(), value.strip()
        if not equals:
            raise EnvFileError(f"line {number}: not NAME=VALUE (no '=')")
        if not NAME.fullmatch(name):
            raise EnvFileError(f"line {number}: the name before '=' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if name in found:
            raise EnvFileError(f"line {number}: {name} is already set on line {first_line[name]}")
        if "\0" in value:
            raise EnvFileError(f"line {number}: {name}'s value holds a NUL byte, which no environment can carry")
        if len(value) >= 2 and value[0] in QUOTES and value[-1] == value[0]:
            value = value[1:-1]
        found[name], first_line[name] = value, number
    return found


def format_env_file(variables: dict[str, str]) -> str:
    """The text `parse_env_file` reads back as `variables` (values hold no newline); tests and docs use it."""
    lines = []
    for name, value in variables.items():
        plain = value == value.strip() and not (value[:1] in QUOTES and value[-1:] == value[:1] and len(value) >= 2)
        lines.append(f"{name}={value}" if plain else f'{name}="{value}"')
    return "".join(line + "\n" for line in lines)


def read_private_file(path: str | os.PathLike[str], *, max_bytes: int, holds: str = "secrets",
                      refused_bits: int = SHARED_BITS) -> bytes:
    """The first `max_bytes` + 1 bytes of a file that holds secrets, refusing one whose mode has `refused_bits`.

    Opened without blocking and checked on the open descriptor, so a FIFO
    cannot stall the event loop and a file swapped after the check is not read.
    EnvFileError says why it is refused (never a byte of it).
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise EnvFileError(f"{path}: cannot open: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise EnvFileError(f"{path}: not a regular file")
        if info.st_mode & refused_bits:
            raise EnvFileError(f"{path}: mode {stat.S_IMODE(info.st_mode):04o} lets the group or others read "
                               f"or write it; it holds {holds}: chmod 600 it (owned by the user mcplhost runs as)")
        return os.read(fd, max_bytes + 1)
    except OSError as exc:
        raise EnvFileError(f"{path}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read and parse an env file, refusing one others may read or write; EnvFileError says why."""
    path = Path(path)
    data = read_private_file(path, max_bytes=ENV_FILE_MAX_BYTES)
    if len(data) > ENV_FILE_MAX_BYTES:
        raise EnvFileError(f"{path}: larger than {ENV_FILE_MAX_BYTES} bytes; not a list of variables")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvFileError(f"{path}: not UTF-8 (byte {exc.start})") from None
    try:
        return parse_env_file(text.replace("\r\n", "\n"))
    except EnvFileError as exc:
        raise EnvFileError(f"{path}: {exc}") from None


# --- the console's token file ---------------------------------------------------------

#: A token file is one line; more than this is not a token.
TOKEN_FILE_MAX_BYTES = 4096
#: The token file's mode is 0600 or stricter: no permission at all for the group or others.
TOKEN_REFUSED_BITS = stat.S_IRWXG | stat.S_IRWXO
#: Fewer characters than this are guessable: refused (`openssl rand -hex 32` writes 64).
MIN_TOKEN_CHARS = 16


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The `[console] token_file`'s token: its text without surrounding whitespace (docs/operations.md#console).

    Refused like an env file when others may read or write it, and when it
    is not one line of at least MIN_TOKEN_CHARS printable characters;
    EnvFileError says why, never what it holds.
    """
    path = Path(path)
    data = read_private_file(path, max_bytes=TOKEN_FILE_MAX_BYTES, holds="the console's token",
                             refused_bits=TOKEN_REFUSED_BITS)
    if len(data) > TOKEN_FILE_MAX_BYTES:
        raise EnvFileError(f"{path}: larger than {TOKEN_FILE_MAX_BYTES} bytes; not a token")
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise EnvFileError(f"{path}: not UTF-8 (byte {exc.start})") from None
    if not token.isprintable():
        raise EnvFileError(f"{path}: the token must be one line of printable characters")
    if len(token) < MIN_TOKEN_CHARS:
        raise EnvFileError(f"{path}: the token is shorter than {MIN_TOKEN_CHARS} characters "
                           "(make one with: openssl rand -hex 32)")
    return token
