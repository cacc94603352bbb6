"""docs/architecture.md's layers table and the `layers` contract in pyproject.toml say the same, in the same order."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_CODE = re.compile(r"`([^`]+)`")


def contract_layers(pyproject: str) -> list[tuple[str, ...]]:
    """Each layer of the package's `layers` contract as its modules, top to bottom; an optional `(name)` as its name.

    The package's is the one over `mcplhost` itself (or naming no container); a subpackage's own layers
    (agents/) are another contract, documented with that package.
    """
    config = tomllib.loads(pyproject)["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"]
                   if c["type"] == "layers" and c.get("containers", ["mcplhost"]) == ["mcplhost"]]
    return [tuple(sorted(part.strip().strip("()") for part in re.split(r"[|:]", layer))) for layer in contract["layers"]]


def documented_layers(architecture: str) -> list[tuple[str, ...]]:
    """The first column of the table under "## Layers", each row as its modules."""
    section = architecture.split("\n## Layers\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [tuple(sorted(_CODE.findall(row.split(" | ")[0]))) for row in rows]


def test_the_documented_layers_are_the_contracts() -> None:
    """Same layers, same siblings, same order: the table readers follow is the one CI checks."""
    documented = documented_layers((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert documented, "docs/architecture.md has no layers table"
    assert documented == contract_layers((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_comparison_sees_a_layer_out_of_place() -> None:
    """Two layers swapped in the document are a difference, and so is a sibling left out."""
    pyproject = '[[tool.importlinter.contracts]]\ntype = "layers"\nlayers = ["cli", "(peers)", "inbound | rpc"]\n'
    table = "\n## Layers\n\n| layer | modules |\n|---|---|\n| `{}` | x |\n| `{}` | y |\n| `inbound` \\| `rpc` | z |\n"
    assert documented_layers(table.format("cli", "peers")) == contract_layers(pyproject)
    assert documented_layers(table.format("peers", "cli")) != contract_layers(pyproject)
    assert documented_layers(table.format("cli", "peers").replace(" \\| `rpc`", "")) != contract_layers(pyproject)
