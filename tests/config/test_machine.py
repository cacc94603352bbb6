"""mcplhost/config/machine.py: a check of the machine that needs a value the type checks refused is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcplhost.config.check import check
from mcplhost.config.machine import machine_problems


@pytest.mark.parametrize(("fields", "looked_up"), [
    ({}, True),
    ({"env": {"PATH": "/nonexistent"}}, True),
    ({"env": {"PATH": 1}}, False),
    ({"env": "PATH=/bin"}, False),
    ({"cwd": 3}, False),
])
def test_the_command_is_looked_up_only_where_it_would_run(tmp_path: Path, fields: dict[str, object],
                                                         looked_up: bool) -> None:
    """The lookup needs the connector's cwd and PATH: one of the wrong type (a type problem already) skips it."""
    raw = {"connectors": [{"name": "a", "command": ["no-such-program-h6"], **fields}]}
    fatal, starts = machine_problems(check(raw), tmp_path)
    assert fatal == []
    assert [p.partition(":")[0] for p in starts] == (["connectors[0].command"] if looked_up else [])


def test_a_store_that_is_not_a_table_names_no_database(tmp_path: Path) -> None:
    """`store = "x.db"` is a type problem; the database checks do not go on with the default path."""
    (tmp_path / "mcplhost.db").mkdir()  # the default path, unusable: it must not be reported
    assert machine_problems(check({"store": "x.db"}), tmp_path) == ([], [])
    assert machine_problems(check({}), tmp_path)[0][0].startswith("store.path: ")
