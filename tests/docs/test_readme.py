"""README.md's test command: the one `.ci/run` runs last, and its sentence about pytest-xdist."""

from __future__ import annotations

import re

from ..harness import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
#: The README's fenced block right after "The tests", holding the one command.
TEST_COMMAND = re.compile(r"^The tests\b.*?```sh\n(?P<command>[^\n]+)\n```", re.MULTILINE | re.DOTALL)


def ci_commands() -> list[str]:
    """`.ci/run`'s commands, comments and blank lines left out."""
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


class TestTheTestCommand:
    def test_ci_runs_the_readme_s_test_command_last(self) -> None:
        """What a contributor is told to run is exactly what CI runs, as its last command."""
        match = TEST_COMMAND.search(README)
        assert match is not None, "README.md has no test command block after 'The tests'"
        assert ci_commands()[-1] == match["command"]

    def test_the_readme_says_whether_pytest_xdist_is_used_beside_it(self) -> None:
        """The paragraph after the command names pytest-xdist, and a `-n` in the command needs it in the dev extra."""
        match = TEST_COMMAND.search(README)
        assert match is not None
        after = README[match.end():match.end() + 1500]
        assert "pytest-xdist" in after.split("\n\n")[1]
        if re.search(r"\s-n\s", f" {match['command']} "):
            assert re.search(r'"pytest-xdist[><=]', (REPO / "pyproject.toml").read_text(encoding="utf-8"))
