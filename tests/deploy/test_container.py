"""deploy/Dockerfile: read as text always, built and run for real when a container engine answers.

The real tests build the image from the repository root, as deploy/README.md says, then run it twice: with a
config of one stub connector, the HEALTHCHECK (`mcplhost status --check`) must reach `healthy`, as the non-root
user with the database on the /data volume; with one connector that crash-loops into the slow lane, it must
reach `unhealthy`, naming that connector. Without a usable docker or podman (none installed, or a client whose
daemon does not answer) or without the base image (offline), they skip and say why (`-ra` shows it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from ..harness import REPO

DOCKERFILE = REPO / "deploy" / "Dockerfile"
EXAMPLE_CONFIG = REPO / "deploy" / "mcplhost.example.toml"
#: Tried in this order; the first whose `info` answers is used.
ENGINES = ("docker", "podman")
#: The Dockerfile's FROM, pulled before the build so an offline machine skips instead of failing.
BASE_IMAGE = "python:3.11-slim"
#: Where the image keeps its config, and what its HEALTHCHECK runs on it.
IMAGE_CONFIG = "/etc/mcplhost/mcplhost.toml"
HEALTHCHECK = ["mcplhost", "status", "--check", "--config", IMAGE_CONFIG]
#: The image's volume for the database, and its user (numeric, so runAsNonRoot can check it).
VOLUME = "/data"
IMAGE_USER = "10001:10001"
#: `info` of a client without a daemon fails fast; one that hangs is as good as absent.
ENGINE_PROBE_TIMEOUT_S = 30
#: A pull and a build with a pip install from PyPI, on a busy machine.
BUILD_TIMEOUT_S = 900
#: From `run` to the wanted health state: start, handshake, then a check every HEALTH_INTERVAL.
HEALTH_TIMEOUT_S = 120
HEALTH_POLL_S = 0.5
#: The run's own health timing, in place of the image's 30 s interval and 180 s start period (same command).
HEALTH_TIMING = ["--health-interval=1s", "--health-start-period=1s", "--health-retries=2"]
#: Each real test: a build (the first), then waiting for the health state.
CONTAINER_TEST_TIMEOUT_S = BUILD_TIMEOUT_S + 2 * HEALTH_TIMEOUT_S


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions in order, as (KEYWORD, arguments), continued lines joined, comments left out."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, arguments = pending.partition(" ")
        found.append((keyword.upper(), arguments.strip()))
        pending = ""
    return found


def only(keyword: str) -> str:
    """The arguments of the Dockerfile's last `keyword` instruction (the one that counts)."""
    values = [arguments for key, arguments in instructions(DOCKERFILE.read_text(encoding="utf-8")) if key == keyword]
    assert values, f"the Dockerfile has no {keyword}"
    return values[-1]


class TestTheDockerfile:
    def test_it_runs_as_a_numeric_user_that_is_not_root(self) -> None:
        """USER names uid and gid by number, neither 0."""
        user = only("USER")
        assert user == IMAGE_USER
        assert all(part.isdigit() and int(part) != 0 for part in user.split(":"))

    def test_the_config_it_ships_keeps_the_database_on_the_volume(self) -> None:
        """The example config, rewritten as the Dockerfile's sed does, puts store.path under VOLUME."""
        assert only("VOLUME") == VOLUME
        run = next(arguments for key, arguments in instructions(DOCKERFILE.read_text(encoding="utf-8"))
                   if key == "RUN" and "mcplhost.example.toml" in arguments)
        config = EXAMPLE_CONFIG.read_text(encoding="utf-8")
        for old, new in re.findall(r"-e 's#([^#]+)#([^#]+)#'", run):
            assert old in config, f"the Dockerfile rewrites {old}, which the example config no longer has"
            config = config.replace(old, new)
        shipped = tomllib.loads(config)
        assert Path(shipped["store"]["path"]).parent == Path(VOLUME)
        assert all(c["command"][0] == "/usr/local/bin/mcplhost" for c in shipped["connectors"])

    def test_the_healthcheck_asks_the_daemon_about_the_config_it_runs(self) -> None:
        """HEALTHCHECK runs `mcplhost status --check` on the config the ENTRYPOINT and CMD start the daemon with."""
        options, _, command = only("HEALTHCHECK").partition("CMD ")
        assert json.loads(command) == HEALTHCHECK
        assert "--start-period=" in options and "--interval=" in options
        assert json.loads(only("ENTRYPOINT")) == ["mcplhost", "run"]
        assert json.loads(only("CMD")) == ["--config", IMAGE_CONFIG]


@dataclass(frozen=True)
class Engine:
    program: str  # the engine's executable, absolute

    @property
    def is_podman(self) -> bool:
        return Path(self.program).name == "podman"

    def run(self, *args: str, timeout: float = ENGINE_PROBE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.program, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    async def run_async(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = await anyio.run_process([self.program, *args], check=False)
        return subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(errors="replace"),
                                           result.stderr.decode(errors="replace"))


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return lines[-1] if lines else f"exit {result.returncode}, no output"


def usable_engine() -> Engine | str:
    """The first container engine that answers, or why there is none."""
    reasons = []
    for name in ENGINES:
        program = shutil.which(name)
        if program is None:
            reasons.append(f"{name} is not installed")
            continue
        try:
            probe = Engine(program).run("info")
        except subprocess.TimeoutExpired:
            reasons.append(f"`{name} info` did not answer within {ENGINE_PROBE_TIMEOUT_S} s")
            continue
        if probe.returncode == 0:
            return Engine(program)
        reasons.append(f"{name} is installed but does not answer ({last_line(probe)})")
    return "no usable container engine: " + "; ".join(reasons)


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[Engine, str]]:
    """deploy/Dockerfile built from the repository root, as an operator builds it; removed afterwards."""
    engine = usable_engine()
    if isinstance(engine, str):
        pytest.skip(engine)
    if engine.run("image", "inspect", BASE_IMAGE).returncode != 0:
        pulled = engine.run("pull", BASE_IMAGE, timeout=BUILD_TIMEOUT_S)
        if pulled.returncode != 0:
            pytest.skip(f"{Path(engine.program).name} cannot pull {BASE_IMAGE} (offline?): {last_line(pulled)}")
    tag = f"mcplhost-test:{uuid.uuid4().hex[:12]}"
    # podman's default (OCI) image format has no HEALTHCHECK; the docker format keeps it.
    image_format = ["--format", "docker"] if engine.is_podman else []
    built = subprocess.run([engine.program, "build", *image_format, "-f", str(DOCKERFILE), "-t", tag, str(REPO)],
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    try:
        yield engine, tag
    finally:
        engine.run("rmi", "-f", tag, timeout=BUILD_TIMEOUT_S)


def container_config(connector: str) -> str:
    return f'[store]\npath = "{VOLUME}/mcplhost.db"\n\n{connector}'


#: One bundled stub chat connector: it registers channels and delivers a few messages.
STUB_CONNECTOR = """[[connectors]]
name = "stub"
command = ["/usr/local/bin/mcplhost", "connector", "stub"]
grant = ["channels.register", "channels.incoming", "pushEvents"]
"""
#: A connector that exits at once, every time: after `burst` failures it is in the slow lane.
LOOPING_CONNECTOR = """[[connectors]]
name = "looper"
command = ["/bin/false"]
[connectors.restart]
policy = "always"
backoff_initial_s = 0.05
backoff_max_s = 0.2
burst = 3
window_s = 60
"""


class Container:
    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.name = name

    async def inspect(self) -> dict:
        result = await self.engine.run_async("inspect", self.name)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)[0]

    async def logs(self) -> str:
        result = await self.engine.run_async("logs", "--tail", "50", self.name)
        return result.stdout[-4000:] + result.stderr[-4000:]

    async def wait_health(self, wanted: str) -> dict:
        """Poll the engine until the health check's state is `wanted`; return the health record."""
        with anyio.fail_after(HEALTH_TIMEOUT_S):
            while True:
                if self.engine.is_podman:  # podman runs checks from systemd timers, absent in CI: run one now
                    await self.engine.run_async("healthcheck", "run", self.name)
                state = (await self.inspect())["State"]
                if not state.get("Running"):
                    pytest.fail(f"the container stopped (exit {state.get('ExitCode')}): {await self.logs()}")
                health = state.get("Health") or state.get("Healthcheck") or {}
                if health.get("Status") == wanted:
                    return health
                await anyio.sleep(HEALTH_POLL_S)  # the engine's state has no event to await


@pytest.fixture
def start_container(image: tuple[Engine, str], tmp_path: Path) -> Iterator[Callable[[str], Container]]:
    """Start the image with a config; every container started is removed with its volume afterwards."""
    engine, tag = image
    names: list[str] = []

    def start(config: str) -> Container:
        path = tmp_path / f"mcplhost-{len(names)}.toml"
        path.write_text(config, encoding="utf-8")
        path.chmod(0o644)  # the image's user reads it through the bind mount
        name = f"mcplhost-test-{uuid.uuid4().hex[:12]}"
        mount = f"{path}:{IMAGE_CONFIG}:ro" + (",z" if engine.is_podman else "")
        started = engine.run("run", "-d", "--init", "--name", name, *HEALTH_TIMING, "-v", mount, tag)
        assert started.returncode == 0, started.stderr
        names.append(name)
        return Container(engine, name)

    try:
        yield start
    finally:
        for name in names:
            engine.run("rm", "-f", "-v", name)


@pytest.mark.timeout(CONTAINER_TEST_TIMEOUT_S)
class TestTheImage:
    async def test_it_turns_healthy_as_a_non_root_user_with_the_database_on_the_volume(
            self, image: tuple[Engine, str], start_container: Callable[[str], Container]) -> None:
        """Built for real: the image's own config, HEALTHCHECK and user; one stub connector; `healthy`."""
        engine, tag = image
        record = json.loads(engine.run("image", "inspect", tag).stdout)[0]
        configured = record["Config"]
        assert configured["User"] == IMAGE_USER and VOLUME in (configured.get("Volumes") or {})
        healthcheck = configured.get("Healthcheck") or record.get("HealthCheck") or {}  # docker's place, podman's
        assert healthcheck.get("Test") == ["CMD", *HEALTHCHECK], record
        container = start_container(container_config(STUB_CONNECTOR))
        health = await container.wait_health("healthy")
        assert health["Log"] and health["Log"][-1]["ExitCode"] == 0
        assert (await engine.run_async("exec", container.name, "id", "-u")).stdout.strip() == IMAGE_USER.split(":")[0]
        mounts = (await container.inspect())["Mounts"]
        assert [m for m in mounts if m["Destination"] == VOLUME and m["Type"] == "volume"], mounts
        with anyio.fail_after(HEALTH_TIMEOUT_S):  # the stub's messages, read from the database on the volume
            while not (await engine.run_async("exec", container.name, "mcplhost", "messages",
                                              "--db", f"{VOLUME}/mcplhost.db")).stdout.strip():
                await anyio.sleep(HEALTH_POLL_S)

    async def test_a_connector_in_the_slow_lane_turns_it_unhealthy(
            self, start_container: Callable[[str], Container]) -> None:
        """The check is more than "the pid is alive": a crash-looping connector makes it `unhealthy`, named."""
        container = start_container(container_config(LOOPING_CONNECTOR))
        health = await container.wait_health("unhealthy")
        last = health["Log"][-1]
        assert last["ExitCode"] == 1 and last["Output"].startswith("looper:"), last
