"""`# Copied from` consistency over a whole checkout, by the rules of Transformers' `utils/check_copies.py`.

A marker `# Copied from transformers.<module>.<Name>[.<method>] [with A->B, C->D all-casing]` says that the definition
under it is the named one with the replacements applied. The rules followed here, as `make repo-consistency` applies
them:

- the target's module is the shortest leading part of the dotted name that is a file under `src/transformers`
  (`tests.` targets in test files: under `tests/`); the names after it are found by `class|def <name>` at growing
  indentation, each after the previous one;
- a block runs while lines are blank, indented deeper than its header, or close a multi-line header; trailing blank
  lines are not part of it. The copy under a marker ends the same way, or at a `# End copy` line;
- replacements are regular expressions applied in order (`re.sub`); `all-casing` adds the lower- and upper-case
  forms; a copy made with replacements is compared after formatting the replaced code (ruff in the repository);
- both sides are cut into inner blocks (nested `class`/`def` with the comments and decorators right above them, and
  the runs of code between them); a block of the copy containing `# Ignore copy` is left out of the comparison on
  both sides, by name;
- blank lines never count; the header's own class or function name may differ; the lines are then compared in order
  (the repository compares pairwise up to the shorter side, and so does this check).

Nothing here touches the file system or runs a process: sources come through `tree.Sources`, and the formatting
step is a callable the edge supplies (running the checkout's pinned ruff).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from typing import Callable, Sequence

from sdpa_port.checkout.tree import Sources, module_path

# formats whole modules, many at once (the checkout's `ruff format` with its pyproject.toml)
Formatter = Callable[[Sequence[str]], list[str]]

MARKER = re.compile(r"^(\s*)#\s*Copied from\s+transformers\.(\S+\.\S+)\s*($|\S.*$)")
TEST_MARKER = re.compile(r"^(\s*)#\s*Copied from\s+tests\.(\S+\.\S+)\s*($|\S.*$)")
_PAIR = re.compile(r"^\s*(\S+)->(\S+)(\s+.*|$)")
_HEADER_END = re.compile(r"^\s*\)(\s*->.*:|:)\s*$")
_CLASS_NAME = re.compile(r"class\s+([^\(:]+)(?:\(|:)")
_DEF_NAME = re.compile(r"def\s+([^\(]+)\(")
IGNORE = "# Ignore copy"
WRAPPER = "class Bla:\n"


# ------------------------------------------------------------------ replacements


@dataclass(frozen=True)
class Replacement:
    old: str  # a regular expression, as the repository reads it
    new: str
    all_casing: bool = False

    def __str__(self) -> str:
        return f"{self.old}->{self.new}{' all-casing' if self.all_casing else ''}"


def parse_replacements(pattern: str) -> tuple[Replacement, ...]:
    """The replacements the text after a marker's target names.

    `with A->B,C->D all-casing`; every `with` is dropped, as upstream.
    """
    out = []
    for part in pattern.replace("with", "").split(","):
        found = _PAIR.search(part)
        if found is not None:
            out.append(Replacement(found.group(1), found.group(2), found.group(3).strip() == "all-casing"))
    return tuple(out)


def apply_replacements(code: str, replacements: Sequence[Replacement]) -> str:
    for item in replacements:
        code = re.sub(item.old, item.new, code)
        if item.all_casing:
            code = re.sub(item.old.lower(), item.new.lower(), code)
            code = re.sub(item.old.upper(), item.new.upper(), code)
    return code


def marker_text(indent: str, target: str, replacements: Sequence[Replacement], test: bool = False) -> str:
    """A marker line as the repository writes it, with `with A->B,C->D`."""
    prefix = "tests" if test else "transformers"
    pairs = f" with {','.join(str(r) for r in replacements)}" if replacements else ""
    return f"{indent}# Copied from {prefix}.{target}{pairs}"


# ------------------------------------------------------------------ lines and blocks


def split_lines(text: str) -> list[str]:
    """Lines with their `\\n`, split on `\\n` only, as the repository reads files."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _continues(line: str, indent: str) -> bool:
    return line.startswith(indent) or not line.strip() or _HEADER_END.search(line) is not None


def block_end(lines: list[str], start: int, indent: int) -> int:
    """Exclusive end of the block whose header is `lines[start]` and whose body is indented by `indent` spaces."""
    prefix = " " * indent
    index = start + 1
    while index < len(lines) and _continues(lines[index], prefix):
        index += 1
    while len(lines[index - 1]) <= 1:
        index -= 1
    return index


@dataclass(frozen=True)
class Block:
    name: str  # `class X`/`def f` for definitions; `_block_without_name_<i>`/`_empty_block_<i>` between them
    start: int
    end: int


def _definition(indent: str) -> re.Pattern[str]:
    return re.compile(rf"^{indent}((class|def)\s+\S+)(\(|\:)")


def split_blocks(lines: list[str], start: int, end: int, indent: int) -> list[Block]:
    """The header of the definition at `start` and its inner blocks.

    Each block carries the comments and decorators above it.
    """
    header = _definition(" " * (indent - 4)).search(lines[start])
    assert header is not None, lines[start]
    body_indent = " " * indent
    index = start
    if "(" in lines[start] and "):" not in lines[start]:
        while index < end and _HEADER_END.search(lines[index]) is None:
            index += 1
    index += 1
    blocks = [Block(header.group(1), start, index)]
    inner = _definition(body_indent)
    previous_end = index
    unnamed = empty = 0

    def gap(until: int) -> None:
        nonlocal unnamed, empty
        if not "".join(lines[previous_end:until]).strip():
            blocks.append(Block(f"_empty_block_{empty}", previous_end, until))
            empty += 1
        else:
            blocks.append(Block(f"_block_without_name_{unnamed}", previous_end, until))
            unnamed += 1

    while index < end:
        found = inner.search(lines[index])
        if found:
            finish = block_end(lines, index, indent + 4)
            first = index
            if index > previous_end:
                # comments and decorators directly above, back to a blank or less indented line
                back = index - 1
                while back >= previous_end and lines[back].strip() and lines[back].startswith(body_indent):
                    back -= 1
                first = back + 1
            if first > previous_end:
                gap(first)
            blocks.append(Block(found.group(1), first, finish))
            previous_end = finish
            index = finish - 1
        index += 1
    if index > previous_end:
        gap(index)
    return blocks


def _shape(blocks: list[Block], is_class: bool) -> list[str]:
    """The structure the repository requires copies to share: named and unnamed runs.

    A class's methods count as one run.
    """
    shape: list[str] = []
    for block in blocks[1:]:
        if block.name.startswith("_block_without_name_"):
            shape.append("unnamed")
        elif not block.name.startswith("_empty_block_") and (not is_class or not shape or shape[-1] == "unnamed"):
            shape.append("named")
    return shape


CLASS_SHAPES = (["unnamed"], ["named"], ["unnamed", "named"])


# ------------------------------------------------------------------ locating code


@dataclass(frozen=True)
class Located:
    path: str
    lines: list[str]
    start: int  # the `class`/`def` line
    end: int  # exclusive
    indent: str  # of the header

    @property
    def code(self) -> str:
        return "".join(self.lines[self.start : self.end])


class Unresolved(Exception):
    """A marker's target names no file or no definition in the checkout."""


def locate(target: str, sources: Sources, base: str = "src/transformers") -> Located:
    found = module_path(target, sources, base)
    if found is None:
        raise Unresolved(f"no module of `{target}` under {base}")
    path, names = found
    text = sources.read(path)
    assert text is not None
    lines = split_lines(text)
    indent = ""
    index = 0
    for name in names:
        pattern = re.compile(rf"^{indent}(class|def)\s+{re.escape(name)}(\(|\:)")
        while index < len(lines) and pattern.search(lines[index]) is None:
            index += 1
        indent += "    "
        index += 1
    if index >= len(lines):
        raise Unresolved(f"`{target}` matches no class or function in {path}")
    start = index - 1
    return Located(path, lines, start, block_end(lines, start, len(indent)), indent[:-4])


def leading_indent(code: str) -> str:
    for line in code.split("\n"):
        if line:
            found = re.search(r"^(\s*)\S", line)
            return found.group(1) if found else ""
    return ""


# ------------------------------------------------------------------ one marker


@dataclass(frozen=True)
class Marker:
    """A `# Copied from` line in a file, and the copy below it."""

    path: str
    line: int  # 0-based index of the marker line
    indent: str
    target: str  # dotted, below `transformers.` (or `tests.`)
    pattern: str  # the text after the target, as written
    test: bool = False

    @property
    def replacements(self) -> tuple[Replacement, ...]:
        return parse_replacements(self.pattern)

    @property
    def qualified(self) -> str:
        return f"{'tests' if self.test else 'transformers'}.{self.target}"


@dataclass(frozen=True)
class Inconsistency:
    marker: Marker
    line: int  # 0-based line of the first difference (the marker's line when unresolved)
    reason: str

    def __str__(self) -> str:
        return f"{self.marker.path}:{self.line + 1}: copy does not match {self.marker.qualified} ({self.reason})"


def find_markers(path: str, text: str) -> list[Marker]:
    test = path.startswith("tests/")
    pattern = TEST_MARKER if test else MARKER
    out = []
    for index, line in enumerate(split_lines(text)):
        found = pattern.search(line)
        if found:
            out.append(Marker(path, index, found.group(1), found.group(2), found.group(3), test))
    return out


@dataclass(frozen=True)
class Comparison:
    """The two sides of one marker, ready to compare: code without blank lines, with the line map of the copy."""

    marker: Marker
    theoretical: str  # replaced, not yet formatted, blank lines kept
    observed: str  # blank lines dropped
    observed_lines: tuple[int, ...]  # 0-based file line of each observed line
    copy_start: int
    copy_end: int
    needs_format: bool
    problem: str | None = None  # a structural mismatch found before any text comparison


def prepare(marker: Marker, sources: Sources, lines: list[str]) -> Comparison:
    base = "tests" if marker.test else "src/transformers"
    upstream = locate(marker.target, sources, base)
    replacements = marker.replacements
    upstream_blocks = split_blocks(upstream.lines, upstream.start, upstream.end, len(upstream.indent) + 4)
    theoretical_blocks: dict[str, str] = {}
    for block in upstream_blocks:
        name = apply_replacements(block.name, replacements)
        theoretical_blocks[name] = apply_replacements("".join(upstream.lines[block.start : block.end]), replacements)
    theoretical_indent = upstream.indent
    start = marker.line + 1 if marker.indent == theoretical_indent else marker.line
    body_indent = leading_indent("\n".join(upstream.code.split("\n")[1:]))
    index = start + 1
    while True:
        index += 1
        if index >= len(lines):
            break
        line = lines[index]
        if not _continues(line, body_indent) or re.search(f"^{body_indent}# End copy", line) is not None:
            break
    while len(lines[index - 1]) <= 1:
        index -= 1
    end = index
    observed_blocks = split_blocks(lines, start, end, len(body_indent))
    is_class = lines[start].startswith(f"{' ' * (len(body_indent) - 4)}class ")
    problem = None
    upstream_shape, copy_shape = _shape(upstream_blocks, is_class), _shape(observed_blocks, is_class)
    if is_class and upstream_shape not in CLASS_SHAPES:
        problem = "the source class has a structure copies cannot follow"
    elif upstream_shape != copy_shape:
        problem = "the structures of the two code blocks differ"
    observed_code: dict[str, tuple[int, int]] = {}
    for block in observed_blocks:
        observed_code[block.name] = (block.start, block.end)
    ignored = {name for name, (a, b) in observed_code.items() if IGNORE in "".join(lines[a:b])}
    theoretical = "".join(code for name, code in theoretical_blocks.items() if name not in ignored)
    observed: list[str] = []
    mapping: list[int] = []
    for name, (a, b) in observed_code.items():
        if name in ignored:
            continue
        for number in range(a, min(b, len(lines))):
            text = lines[number].rstrip("\n")
            if text.strip():
                observed.append(text + "\n")
                mapping.append(number)
    return Comparison(
        marker, theoretical, "".join(observed), tuple(mapping), start, end, bool(marker.pattern), problem
    )


def _own_name(observed: str, theoretical: str) -> str:
    """`theoretical` with its header's class or function name replaced by the copy's, since names may differ."""
    observed_header = observed.split("\n")[0]
    header, _, rest = theoretical.partition("\n")
    for pattern in (_CLASS_NAME, _DEF_NAME):
        own = pattern.match(observed_header)
        if own is not None:
            found = pattern.search(header)
            if found is not None:
                header = header.replace(found.group(1), own.group(1))
    return f"{header}\n{rest}" if "\n" in theoretical else header


def first_difference(observed: str, theoretical: str) -> int | None:
    """Index of the first differing line, or None; lines are compared pairwise up to the shorter side, as upstream."""
    theoretical = _own_name(observed, theoretical)
    for index, (left, right) in enumerate(zip(observed.split("\n"), theoretical.split("\n"))):
        if left != right:
            return index
    return None


def _without_blank_lines(code: str) -> str:
    while "\n\n" in code:
        code = code.replace("\n\n", "\n")
    return code


def to_module(code: str) -> str:
    """An indented snippet wrapped so that it formats and parses as a module."""
    return f"{WRAPPER}{code}" if leading_indent(code) else code


def from_module(code: str, original: str) -> str:
    return code[len(WRAPPER) :] if leading_indent(original) else code


# ------------------------------------------------------------------ the tree


def check_tree(
    sources: Sources,
    formatter: Formatter | None = None,
    paths: Sequence[str] | None = None,
) -> list[Inconsistency]:
    """Every marker in `paths`, by default the whole tree, whose copy does not match its source.

    Copies made with replacements are compared after `formatter` when the plain comparison fails; without one they are
    accepted when they equal the replaced source up to formatting (same syntax tree, same comments).
    """
    pending: list[tuple[Comparison, int]] = []
    found: list[Inconsistency] = []
    for path in paths if paths is not None else sources.paths():
        text = sources.read(path)
        if text is None or "Copied from" not in text:
            continue
        lines = split_lines(text)
        for marker in find_markers(path, text):
            try:
                comparison = prepare(marker, sources, lines)
            except Unresolved as error:
                found.append(Inconsistency(marker, marker.line, str(error)))
                continue
            if comparison.problem is not None:
                found.append(Inconsistency(marker, comparison.copy_start, comparison.problem))
                continue
            difference = first_difference(comparison.observed, _without_blank_lines(comparison.theoretical))
            if difference is None:
                continue
            if comparison.needs_format:
                pending.append((comparison, difference))
            else:
                found.append(_inconsistency(comparison, difference))
    if pending:
        found.extend(_formatted(pending, formatter))
    return sorted(found, key=lambda item: (item.marker.path, item.line))


def _inconsistency(comparison: Comparison, difference: int) -> Inconsistency:
    mapping = comparison.observed_lines
    line = mapping[difference] if difference < len(mapping) else comparison.copy_end - 1
    return Inconsistency(comparison.marker, line, "the copy differs from the source")


def _formatted(pending: list[tuple[Comparison, int]], formatter: Formatter | None) -> list[Inconsistency]:
    out = []
    if formatter is not None:
        modules = formatter([to_module(c.theoretical) for c, _ in pending])
        for (comparison, _), formatted in zip(pending, modules):
            theoretical = _without_blank_lines(from_module(formatted, comparison.theoretical))
            difference = first_difference(comparison.observed, theoretical)
            if difference is not None:
                out.append(_inconsistency(comparison, difference))
        return out
    for comparison, difference in pending:
        if not same_up_to_formatting(comparison.observed, comparison.theoretical):
            out.append(_inconsistency(comparison, difference))
    return out


def same_up_to_formatting(observed: str, theoretical: str) -> bool:
    """Equal syntax trees and equal comments: what formatting the replaced code could still make equal."""
    left, right = _shape_of(observed), _shape_of(_own_name(observed, _without_blank_lines(theoretical)))
    return left is not None and left == right


def _shape_of(code: str) -> tuple[str, tuple[str, ...]] | None:
    module = to_module(code)
    try:
        tree = ast.dump(ast.parse(module))
        comments = tuple(
            token.string
            for token in tokenize.generate_tokens(io.StringIO(module).readline)
            if token.type == tokenize.COMMENT
        )
    except (SyntaxError, tokenize.TokenError, IndentationError):
        return None
    return tree, comments
