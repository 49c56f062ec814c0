"""Reading a tool's description and argument descriptions from its docstring.

Three common styles are understood: Google (``Args:`` with ``name (type): text``
entries), numpy (``Parameters`` underlined with dashes, ``name : type`` entries
with indented text) and Sphinx (``:param name: text``). Everything before the
first section is the tool's description.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

__all__ = ["ParsedDocstring", "parse_docstring"]

_ARG_SECTIONS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments", "other parameters"}
_OTHER_SECTIONS = {
    "returns",
    "return",
    "yields",
    "yield",
    "raises",
    "raise",
    "examples",
    "example",
    "notes",
    "note",
    "see also",
    "references",
    "warnings",
    "warning",
    "attributes",
    "todo",
}
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(?P<name>[A-Za-z_]\w*)\*{0,2}\s*(?:\((?P<type>[^)]*)\))?\s*:\s*(?P<text>.*)$")
_NUMPY_ENTRY = re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*(?::\s*(?P<type>.*))?$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(?P<name>[A-Za-z_]\w*)\s*:\s*(?P<text>.*)$")
_SPHINX_FIELD = re.compile(r"^:\w+")


@dataclass
class ParsedDocstring:
    """The description of a function and of each argument it documents."""

    description: str = ""
    params: dict[str, str] = field(default_factory=dict)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _join(lines: list[str]) -> str:
    """Paragraphs joined by a blank line, lines inside a paragraph by a space."""
    paragraphs: list[list[str]] = [[]]
    for line in lines:
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return "\n\n".join(" ".join(p) for p in paragraphs if p)


def _section_at(lines: list[str], i: int) -> tuple[str, int] | None:
    """(section name, lines it takes) when a Google or numpy section header starts at line ``i``."""
    line = lines[i]
    if _indent(line):
        return None
    title = line.strip().lower()
    if title.endswith(":") and title[:-1].strip() in _ARG_SECTIONS | _OTHER_SECTIONS:
        return title[:-1].strip(), 1
    underline = lines[i + 1].strip() if i + 1 < len(lines) else ""
    if title in _ARG_SECTIONS | _OTHER_SECTIONS and underline and set(underline) <= {"-", "="}:
        return title, 2
    return None


def _entries(body: list[str], numpy: bool) -> dict[str, str]:
    """Argument entries of one section: an entry line at the section's indent, then deeper continuation lines."""
    out: dict[str, str] = {}
    base = min((_indent(line) for line in body if line.strip()), default=0)
    name: str | None = None
    text: list[str] = []
    for line in body:
        if not line.strip():
            text.append("")
            continue
        if _indent(line) <= base:
            if name is not None:
                out[name] = _join(text)
            match = (_NUMPY_ENTRY if numpy else _GOOGLE_ENTRY).match(line.strip())
            name = match.group("name") if match else None
            text = [] if numpy or not match else [match.group("text")]
        elif name is not None:
            text.append(line)
    if name is not None:
        out[name] = _join(text)
    return out


def parse_docstring(doc: str | None) -> ParsedDocstring:
    """Split ``doc`` into the description and ``{argument: description}``."""
    if not doc:
        return ParsedDocstring()
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    i = 0
    in_description = True
    while i < len(lines):
        line = lines[i]
        sphinx = _SPHINX_PARAM.match(line.strip())
        if sphinx:
            text = [sphinx.group("text")]
            i += 1
            while i < len(lines) and lines[i].strip() and not _SPHINX_FIELD.match(lines[i].strip()):
                text.append(lines[i])
                i += 1
            params[sphinx.group("name")] = _join(text)
            in_description = False
            continue
        if _SPHINX_FIELD.match(line.strip()):  # :returns:, :raises: ...
            in_description = False
            i += 1
            continue
        section = _section_at(lines, i)
        if section is None:
            if in_description:
                description.append(line)
            i += 1
            continue
        in_description = False
        title, taken = section
        i += taken
        body = []
        while i < len(lines) and _section_at(lines, i) is None and not _SPHINX_FIELD.match(lines[i].strip()):
            body.append(lines[i])
            i += 1
        if title in _ARG_SECTIONS:
            params.update(_entries(body, numpy=taken == 2))
    return ParsedDocstring(_join(description), params)
