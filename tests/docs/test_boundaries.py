"""docs/architecture.md's list of exception boundaries names exactly the modules that catch `Exception`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PATH = re.compile(r"`(mcplhost/[\w/]+\.py)`")
_CATCH = re.compile(r"^\s*except Exception\b", re.MULTILINE)


def documented_boundaries(architecture: str) -> set[str]:
    """The modules the "Exception boundaries" rule lists (up to "Everywhere else", which names the narrow catches)."""
    section = architecture.split("**Exception boundaries.**", 1)[1].split("Everywhere else code catches", 1)[0]
    return set(_PATH.findall(section))


def catching_modules(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in sorted((root / "mcplhost").rglob("*.py"))
            if _CATCH.search(path.read_text(encoding="utf-8"))}


def test_every_module_that_catches_exception_is_a_documented_boundary_and_no_other() -> None:
    """A new `except Exception` is either a boundary the document names, or a catch that should be narrower."""
    documented = documented_boundaries((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert documented == catching_modules(ROOT)


def test_the_section_is_read_up_to_the_narrow_catches() -> None:
    """A module named after "Everywhere else" (a narrow catch's owner) is not counted as a boundary."""
    text = ("**Exception boundaries.** `mcplhost/a.py` and `mcplhost/b/c.py`.\n"
            "Everywhere else code catches what it means (`mcplhost/d.py`).")
    assert documented_boundaries(text) == {"mcplhost/a.py", "mcplhost/b/c.py"}
