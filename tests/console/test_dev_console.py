"""`mcplhost dev --console`: the web console on the dev run, on a free loopback port named on the banner."""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from ..cli.support import cli_env
from ..cli.test_dev import DETERMINISTIC
from ..harness import PYTHON, REPO

ADDRESS = re.compile(r"^  web console: http://(127\.0\.0\.1:\d+)/ ")


def test_dev_serves_the_console_on_the_address_its_banner_names(tmp_path: Path) -> None:
    """The banner's last line names a loopback address; the overview there lists dev's connectors and agents,
    and the feed answers; Ctrl-C ends dev with exit 0."""
    dev = subprocess.Popen([PYTHON, "-m", "mcplhost", "dev", "--console", "--seconds", "60", "--db",
                            str(tmp_path / "dev.db")], cwd=REPO, env=cli_env(DETERMINISTIC), text=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert dev.stderr is not None
        banner = []
        for line in dev.stderr:
            banner.append(line)
            if ADDRESS.match(line) or len(banner) > 40:
                break
        found = ADDRESS.match(banner[-1])
        assert found, "".join(banner)
        with urllib.request.urlopen(f"http://{found.group(1)}/", timeout=20) as answer:
            overview = answer.read().decode()
        for name in ("stub", "zulip", "heartbeat", "console", "scout", "scribe"):
            assert f'data-name="{name}"' in overview, name
        with urllib.request.urlopen(f"http://{found.group(1)}/feed", timeout=20) as answer:
            assert answer.status == 200
    finally:
        dev.send_signal(signal.SIGINT)
        code = dev.wait(timeout=60)
        if dev.stderr is not None:
            dev.stderr.close()
    assert code == 0
