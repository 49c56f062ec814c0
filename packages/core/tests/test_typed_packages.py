"""Every package of the monorepo ships ``py.typed``: a plugin author's type checker reads their annotations."""

from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[2]


def test_every_package_ships_py_typed() -> None:
    roots = sorted(p for p in PACKAGES.glob("*/src/*") if p.is_dir() and (p / "__init__.py").exists())
    assert len(roots) >= 7, roots
    assert [str(r.relative_to(PACKAGES)) for r in roots if not (r / "py.typed").is_file()] == []
