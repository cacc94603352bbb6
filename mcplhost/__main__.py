"""`mcplhost` and `python -m mcplhost`: the command, quiet when Ctrl-C comes at any moment.

The command's modules take up to a second to load on a busy machine, and a
Ctrl-C then would print the traceback of whatever import it landed in. So
they are loaded here, under the same catch `main` has for the rest
(mcplhost/cli/__init__.py): an interrupt before the command did anything is
the same quiet exit 0 as a graceful stop. Once the command has its exit
status, a late Ctrl-C is ignored: nothing is left to stop.

structlog imports rich where it is installed (a development tool brings it)
for the tracebacks its console renderer can draw; ours never asks for them
(mcplhost/logs.py turns an exception into text before any renderer), so the
command's process refuses that import rather than pay about a tenth of a
second of CPU for it on every start.
"""

import sys

#: The exit status of a command interrupted while it loads: nothing was started, so nothing failed.
EXIT_INTERRUPTED = 0


def main() -> int:
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]  # None: `import rich` raises ImportError
    try:
        from .cli import main as command

        status = command()
    except KeyboardInterrupt:
        status = EXIT_INTERRUPTED
    try:
        import signal  # here, not above: importing it takes long enough to be interrupted

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the interpreter's own exit must not print one either
    except KeyboardInterrupt:
        pass
    return status


if __name__ == "__main__":
    sys.exit(main())
