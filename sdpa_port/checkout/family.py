"""Keep every `# Copied from` marker of a checkout true after ports: follow the copies, or port the family.

A port changes definitions that other files copy (`BertAttention` now selects its class from
`BERT_SELF_ATTENTION_CLASSES`). For each marker that no longer holds, in order of preference:

1. **Follow** (what the hand-written ports did): the copy becomes the ported source under the marker's replacements,
   the marker gains the casing replacement the new names need (`with Bert->ClapText,BERT->CLAP_TEXT`), and the file
   gets what the new code names: the dict of attention classes with the entries it can fill (`{"eager": ...}`) and
   the imports. Allowed only where it leaves the copying model's behaviour as it was: the model does not support
   SDPA (so `config._attn_implementation` stays "eager" for it) and the copy would not gain a capability flag.
2. **Port the family**: the copying file is ported too (same engine), after which its markers usually hold again
   (and 1. fills in the replacements).
3. Otherwise the marker stays stale and is reported.

Markers the engine removed from a ported file are put back where they hold in the final tree. Everything is
computed over `Sources`, edits are returned as texts: nothing here writes a file.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import libcst as cst

from sdpa_port.checkout import copies
from sdpa_port.checkout.copies import Formatter, Inconsistency, Replacement, apply_replacements, marker_text
from sdpa_port.checkout.tree import Overlay, Sources, module_path, relative_module
from sdpa_port.rewrite.imports import add_import_from

FLAGS = (
    "_supports_sdpa",
    "_supports_flash_attn_2",
    "_supports_flash_attn",
    "_supports_flex_attn",
    "_supports_attention_backend",
)
MAX_ROUNDS = 6


@dataclass(frozen=True)
class Ported:
    """What a port of one file answered: the new source when it ported, and its one-line detail otherwise."""

    source: str | None
    detail: str


# the engine, seen from here: (checkout-relative path, source) -> Ported
Porter = Callable[[str, str], Ported]


@dataclass
class FamilyResult:
    edits: dict[str, str]  # path -> new text, for every file changed (the ports given included)
    notes: dict[str, list[str]] = field(default_factory=dict)  # path -> what was done there and why
    family: list[str] = field(default_factory=list)  # files ported because they copy ported code
    stale: list[Inconsistency] = field(default_factory=list)  # markers still not holding (new ones only)
    preexisting: list[Inconsistency] = field(default_factory=list)  # in the files looked at, before any port

    def note(self, path: str, text: str) -> None:
        self.notes.setdefault(path, []).append(text)


def keep_consistent(
    base: Sources,
    ported: dict[str, str],
    port: Porter,
    formatter: Formatter | None = None,
    originals_removed: dict[str, list[str]] | None = None,
) -> FamilyResult:
    """Edits that keep the markers of `base` with `ported` laid over it holding.

    `ported` maps checkout-relative paths to their ported texts; `originals_removed` maps a ported path to the
    marker lines its port removed (they are restored where they hold again).
    """
    baseline = _Baseline(base, formatter)
    result = FamilyResult(edits=dict(ported))
    restored = _restore_markers(base, result, originals_removed or {})
    tried_port: set[str] = set(ported)
    stale: list[Inconsistency] = []
    for _ in range(MAX_ROUNDS):
        tree = Overlay(base, result.edits)
        stale = baseline.new(tree, copying(tree, result.edits))
        if not stale:
            break
        progressed = False
        for path, items in _by_file(stale).items():
            text = tree.read(path)
            assert text is not None
            is_port = path in tried_port and path in result.edits
            if is_port and _port_upstreams(base, tree, result, port, items, restored, tried_port):
                progressed = True  # judged again next round, with the upstream ported too
                continue
            plan = [_follow_plan(item, tree, text, marker_only=is_port) for item in items]
            if any(p is None for p in plan) and path not in tried_port:
                tried_port.add(path)
                answer = port(path, base.read(path) or text)
                if answer.source is not None:
                    result.edits[path] = answer.source
                    result.family.append(path)
                    lost = removed_markers(base.read(path) or text, answer.source, path)
                    for where, comments in _restore_markers(base, result, {path: lost}).items():
                        restored.setdefault(where, []).extend(comments)
                    upstreams = sorted({item.marker.qualified for item in items})
                    result.note(
                        path, f"ported as family of {', '.join(upstreams)}: its copies of them changed with them"
                    )
                    progressed = True
                    continue
                result.note(path, f"could not port it with its upstream ({answer.detail})")
            followed = text
            for item, follow in zip(items, plan):
                if follow is None:
                    continue
                updated = _apply_follow(followed, follow, tree, formatter)
                if updated is not None and updated != followed:
                    followed = updated
                    result.note(path, follow.describe())
            if followed != text:
                result.edits[path] = followed
                progressed = True
        if not progressed:
            break
    if restored:
        stale = _drop_restored(result, restored, stale)
    result.stale = stale
    result.preexisting = baseline.found
    return result


def copying(tree: Sources, changed: dict[str, str] | Sequence[str]) -> list[str]:
    """The files with a marker naming a module among `changed` (and those files themselves)."""
    needles = tuple(f"transformers.{m}." for m in (relative_module(p) for p in changed) if m)
    out = set(changed)
    for path in tree.paths():
        text = tree.read(path)
        if text is not None and "Copied from" in text and any(n in text for n in needles):
            out.add(path)
    return sorted(p for p in out if p.endswith(".py"))


class _Baseline:
    """The inconsistencies each file had before any port (checked on demand, once per file)."""

    def __init__(self, base: Sources, formatter: Formatter | None) -> None:
        self.base = base
        self.formatter = formatter
        self.per_file: dict[str, list[Inconsistency]] = {}

    @property
    def found(self) -> list[Inconsistency]:
        return [item for items in self.per_file.values() for item in items]

    def new(self, tree: Sources, paths: list[str]) -> list[Inconsistency]:
        unknown = [p for p in paths if p not in self.per_file and self.base.read(p) is not None]
        for path in unknown:
            self.per_file[path] = []
        for item in copies.check_tree(self.base, self.formatter, paths=unknown):
            self.per_file[item.marker.path].append(item)
        known = Counter(_identity(item) for item in self.found)
        return _new(copies.check_tree(tree, self.formatter, paths=paths), known)


def _identity(item: Inconsistency) -> tuple[str, str, str]:
    return item.marker.path, item.marker.qualified, item.marker.pattern


def _new(found: list[Inconsistency], known: Counter[tuple[str, str, str]]) -> list[Inconsistency]:
    remaining = Counter(known)
    out = []
    for item in found:
        key = _identity(item)
        if remaining[key]:
            remaining[key] -= 1
        else:
            out.append(item)
    return out


def _by_file(items: list[Inconsistency]) -> dict[str, list[Inconsistency]]:
    grouped: dict[str, list[Inconsistency]] = {}
    for item in items:
        grouped.setdefault(item.marker.path, []).append(item)
    return grouped


# ------------------------------------------------------------------ following a copy


@dataclass(frozen=True)
class Follow:
    """How one stale copy follows its source: the replacements to use, and what its file must gain."""

    item: Inconsistency
    replacements: tuple[Replacement, ...]
    dicts: tuple[tuple[str, str], ...]  # (source dict name in the upstream file, name in this file) to add
    imports: tuple[tuple[int, str, str], ...]  # (relative level, module, name)

    def describe(self) -> str:
        marker = self.item.marker
        parts = [f"copy of {marker.qualified} (line {marker.line + 1}) follows its ported source"]
        added = [str(r) for r in self.replacements if r not in marker.replacements]
        if added:
            parts.append(f"marker gains {', '.join(added)}")
        parts.extend(f"added {name} (the entries this model has)" for _, name in self.dicts)
        parts.extend(f"imported {name}" for _, _, name in self.imports)
        return "; ".join(parts)


def _follow_plan(item: Inconsistency, tree: Sources, text: str, marker_only: bool = False) -> Follow | None:
    """A plan that makes `item`'s copy hold without changing what the copying model does, or None.

    `marker_only`: the file is a port, whose code stays as the engine wrote it; only the marker's replacements may
    change (the copy must already equal its source under them, up to formatting).
    """
    marker = item.marker
    supports_sdpa = _supports_sdpa(text)
    if marker.test:
        return None
    try:
        upstream = copies.locate(marker.target, tree)
    except copies.Unresolved:
        return None
    lines = copies.split_lines(text)
    comparison = copies.prepare(marker, tree, lines)
    copied = "".join(lines[comparison.copy_start : comparison.copy_end])
    if copies.IGNORE in copied or "# End copy" in "".join(lines[comparison.copy_start : comparison.copy_end + 1]):
        return None
    upstream_text = tree.read(upstream.path) or ""
    upstream_names = _top_level(upstream_text)
    local_names = _top_level(text)
    replacements = marker.replacements
    dicts: list[tuple[str, str]] = []
    imports: list[tuple[int, str, str]] = []
    for _ in range(4):  # each added replacement may reveal another name to resolve
        code = apply_replacements(upstream.code, replacements)
        if _gains_flag(code, copied):
            return None
        renamed = {
            apply_replacements(name, replacements): name for name in upstream_names.defined | upstream_names.imported
        }
        missing = sorted(
            name
            for name in _names_used(code)
            if name in renamed and name not in local_names.all and name not in _BUILTINS
        )
        dicts, imports, extra = [], [], ()
        for name in missing:
            source_name = renamed[name]
            if source_name in upstream_names.imported:
                module = _absolute_import(upstream_text, upstream.path, source_name)
                if module is None:
                    return None
                level, dotted = _relative_to(module, marker.path)
                imports.append((level, dotted, source_name))
                continue
            entries = _dict_entries(upstream_text, source_name)
            if entries is None or "eager" not in entries:
                return None
            eager_here = apply_replacements(entries["eager"], replacements)
            if eager_here not in local_names.defined:
                return None
            existing = _dict_for(text, eager_here)
            wanted = existing or dict_name(eager_here)
            extension = _extension(name, wanted, replacements)
            if extension:
                extra = extension
                break
            if existing is None:
                dicts.append((source_name, wanted))
        if not extra:
            if dicts and supports_sdpa:
                return None  # a dict of this model's classes without its "sdpa" entry would break it
            if marker_only and (dicts or imports or not copies.same_up_to_formatting(comparison.observed, code)):
                return None
            return Follow(item, replacements, tuple(dicts), tuple(imports))
        replacements = replacements + extra
    return None


def _extension(current: str, wanted: str, replacements: Sequence[Replacement]) -> tuple[Replacement, ...]:
    """Replacements to append so that `current` (a name after the marker's replacements) reads `wanted`.

    The repository's own form first: the upper-case spelling of a replaced name (`BERT->CLAP_TEXT` beside
    `Bert->ClapText`); else the whole name.
    """
    if current == wanted:
        return ()
    for item in replacements:
        upper = item.old.upper()
        if upper == item.old or not re.fullmatch(r"[A-Za-z0-9_]+", item.old) or upper not in current:
            continue
        before, _, after = current.partition(upper)
        if wanted.startswith(before) and wanted.endswith(after) and len(wanted) > len(before) + len(after):
            new = wanted[len(before) : len(wanted) - len(after)]
            if re.fullmatch(r"[A-Z0-9_]+", new):
                return (Replacement(upper, new),)
    return (Replacement(re.escape(current), wanted),)


def dict_name(eager_class: str) -> str:
    """The name the engine gives the dict of a class's implementations (`ClapTextSelfAttention` ->
    `CLAP_TEXT_SELF_ATTENTION_CLASSES`), so that porting this model later registers into the same dict."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", eager_class).upper() + "_CLASSES"


def _apply_follow(text: str, follow: Follow, tree: Sources, formatter: Formatter | None) -> str | None:
    marker = follow.item.marker
    # the marker may have moved since it was found (an earlier edit of this file): find it again by its text
    found = [
        m for m in copies.find_markers(marker.path, text) if (m.target, m.pattern) == (marker.target, marker.pattern)
    ]
    if not found:
        return None
    current = min(found, key=lambda m: abs(m.line - marker.line))
    upstream = copies.locate(marker.target, tree)
    code = apply_replacements(upstream.code, follow.replacements)
    if formatter is not None and follow.replacements:
        code = copies.from_module(formatter([copies.to_module(code)])[0], code)
    module = cst.parse_module(text)
    tree_ast = ast.parse(text)
    lines = copies.split_lines(text)
    comparison = copies.prepare(current, tree, lines)
    owner = _definition_at(tree_ast, comparison.copy_start + 1)
    if owner is None:
        return None
    new_marker = marker_text(current.indent, current.target, follow.replacements)
    module = _replace_definition(module, owner, code, current, new_marker)
    if module is None:
        return None
    upstream_text = tree.read(upstream.path) or ""
    for source_name, name in follow.dicts:
        if name in _top_level(module.code).defined:
            continue  # added for an earlier copy in this file
        statement = _dict_statement(upstream_text, source_name, name, follow.replacements, _top_level(text).defined)
        if statement is None:
            return None
        module = _insert_before(module, owner[0], statement)
    for level, dotted, name in follow.imports:
        module = add_import_from(module, level, dotted, name)
    return module.code


# ------------------------------------------------------------------ facts read from texts


@dataclass(frozen=True)
class Names:
    defined: frozenset[str]
    imported: frozenset[str]

    @property
    def all(self) -> frozenset[str]:
        return self.defined | self.imported


_BUILTINS = frozenset(dir(builtins))


def _top_level(text: str) -> Names:
    tree = ast.parse(text)
    defined: set[str] = set()
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    imported.update((a.asname or a.name).split(".")[0] for a in inner.names)
                elif isinstance(inner, (ast.ClassDef, ast.FunctionDef)):
                    defined.add(inner.name)
    return Names(frozenset(defined), frozenset(imported))


def _names_used(code: str) -> set[str]:
    try:
        tree = ast.parse(copies.to_module(code))
    except SyntaxError:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def _supports_sdpa(text: str) -> bool:
    return re.search(r"^\s+_supports_sdpa\s*=\s*True", text, re.MULTILINE) is not None


def _gains_flag(code: str, copied: str) -> bool:
    """The new code sets a capability flag to True that the copy does not set (the copy would claim support)."""
    for flag in FLAGS:
        pattern = rf"^\s+{flag}\s*=\s*True"
        if re.search(pattern, code, re.MULTILINE) and not re.search(pattern, copied, re.MULTILINE):
            return True
    return False


def _dict_entries(text: str, name: str) -> dict[str, str] | None:
    """`NAME = {"eager": A, "sdpa": B}` at top level -> {"eager": "A", "sdpa": "B"}."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == [name]:
            if not isinstance(node.value, ast.Dict):
                return None
            entries = {}
            for key, value in zip(node.value.keys, node.value.values):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Name)):
                    return None
                entries[key.value] = value.id
            return entries
    return None


def _dict_for(text: str, eager_class: str) -> str | None:
    """The top-level dict of this file whose "eager" entry is `eager_class`."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            entries = _dict_entries(text, node.targets[0].id) if isinstance(node.value, ast.Dict) else None
            if entries and entries.get("eager") == eager_class:
                return node.targets[0].id
    return None


def _absolute_import(text: str, path: str, name: str) -> str | None:
    """The absolute module a top-level `from ... import name` of the file at `path` imports `name` from."""
    package = relative_module(path)
    if package is None:
        return None
    parts = ["transformers", *package.split(".")[:-1]]
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            if node.level == 0:
                return node.module
            base = parts[: len(parts) - node.level + 1]
            return ".".join(base + ([node.module] if node.module else []))
    return None


def _relative_to(module: str, path: str) -> tuple[int, str]:
    """How the file at `path` imports `module` relatively (`transformers.modeling_attn_mask_utils` from
    `models/clap/modeling_clap.py` -> (3, `modeling_attn_mask_utils`))."""
    package = ["transformers", *(relative_module(path) or "").split(".")[:-1]]
    target = module.split(".")
    common = 0
    while common < min(len(package), len(target) - 1) and package[common] == target[common]:
        common += 1
    return len(package) - common + 1, ".".join(target[common:])


# ------------------------------------------------------------------ CST edits


def _definition_at(tree: ast.Module, line: int) -> tuple[str, str | None] | None:
    """(top-level name, method name or None) of the class or function whose header is on 1-based `line`."""
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.lineno == line:
                return node.name, None
            if isinstance(node, ast.ClassDef):
                for inner in node.body:
                    if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner.lineno == line:
                        return node.name, inner.name
    return None


def _parsed_definition(code: str) -> cst.ClassDef | cst.FunctionDef | None:
    module = cst.parse_module(copies.to_module(code))
    node = module.body[0]
    if copies.leading_indent(code):
        assert isinstance(node, cst.ClassDef) and isinstance(node.body, cst.IndentedBlock)
        node = node.body.body[0]
    return node if isinstance(node, (cst.ClassDef, cst.FunctionDef)) else None


def _replace_definition(
    module: cst.Module, owner: tuple[str, str | None], code: str, marker: copies.Marker, new_marker: str
) -> cst.Module | None:
    replacement = _parsed_definition(code)
    if replacement is None:
        return None
    old_comment = f"# Copied from {'tests' if marker.test else 'transformers'}.{marker.target}"

    def remarked(lines: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
        return [
            line.with_changes(comment=cst.Comment(new_marker.strip()))
            if line.comment is not None and line.comment.value.startswith(old_comment)
            else line
            for line in lines
        ]

    def swap(node: cst.ClassDef | cst.FunctionDef) -> cst.ClassDef | cst.FunctionDef:
        return replacement.with_changes(
            name=node.name,
            leading_lines=remarked(node.leading_lines),
            decorators=node.decorators,
            lines_after_decorators=remarked(node.lines_after_decorators),
        )

    top, method = owner
    body = list(module.body)
    for index, statement in enumerate(body):
        if not isinstance(statement, (cst.ClassDef, cst.FunctionDef)) or statement.name.value != top:
            continue
        if method is None:
            body[index] = swap(statement)
            return module.with_changes(body=body)
        if not isinstance(statement, cst.ClassDef) or not isinstance(statement.body, cst.IndentedBlock):
            return None
        inner = list(statement.body.body)
        for position, member in enumerate(inner):
            if isinstance(member, cst.FunctionDef) and member.name.value == method:
                inner[position] = swap(member)
                body[index] = statement.with_changes(body=statement.body.with_changes(body=inner))
                return module.with_changes(body=body)
    return None


def _dict_statement(
    upstream_text: str, source_name: str, name: str, replacements: Sequence[Replacement], defined: frozenset[str]
) -> cst.SimpleStatementLine | None:
    """The upstream dict under the replacements, keeping the entries whose classes this file defines."""
    for statement in cst.parse_module(upstream_text).body:
        if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(statement.body[0], cst.Assign):
            continue
        assign = statement.body[0]
        target = assign.targets[0].target
        if not (isinstance(target, cst.Name) and target.value == source_name and isinstance(assign.value, cst.Dict)):
            continue
        elements = []
        original = list(assign.value.elements)
        for element in original:
            if not isinstance(element, cst.DictElement) or not isinstance(element.value, cst.Name):
                return None
            value = apply_replacements(element.value.value, replacements)
            if value in defined:
                elements.append(element.with_changes(value=cst.Name(value)))
        if not elements:
            return None
        elements[-1] = elements[-1].with_changes(comma=original[-1].comma)
        return cst.SimpleStatementLine(
            body=[
                assign.with_changes(
                    targets=[cst.AssignTarget(cst.Name(name))], value=assign.value.with_changes(elements=elements)
                )
            ],
            leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
        )
    return None


def _insert_before(module: cst.Module, top: str, statement: cst.SimpleStatementLine) -> cst.Module:
    body = list(module.body)
    for index, node in enumerate(body):
        if isinstance(node, (cst.ClassDef, cst.FunctionDef)) and node.name.value == top:
            body.insert(index, statement)
            return module.with_changes(body=body)
    return module


# ------------------------------------------------------------------ markers a port removed


def removed_markers(original: str, ported: str, path: str) -> list[str]:
    """The marker lines of `original` that its port no longer has."""
    kept = {line.strip() for line in ported.splitlines() if "Copied from" in line}
    lines = copies.split_lines(original)
    return [
        lines[m.line].rstrip("\n") for m in copies.find_markers(path, original) if lines[m.line].strip() not in kept
    ]


def lost_markers(original: str, final: str, path: str) -> list[str]:
    """The markers of `original` of which `final` keeps no form (not even with more replacements)."""
    present = [line.strip() for line in final.splitlines() if "Copied from" in line]
    lines = copies.split_lines(original)
    out = []
    for marker in copies.find_markers(path, original):
        head = f"# Copied from {marker.qualified}"
        if not any(line == head or line.startswith(head + " ") for line in present):
            out.append(lines[marker.line].strip())
    return out


def _restore_markers(base: Sources, result: FamilyResult, removed: dict[str, list[str]]) -> dict[str, list[str]]:
    """Put the markers a port removed back on their definitions, to be judged with the others (path -> markers)."""
    restored: dict[str, list[str]] = {}
    for path, comments in removed.items():
        original = base.read(path)
        if path not in result.edits or original is None:
            continue
        for comment in comments:
            where = _marked_definition(original, comment)
            text = _add_marker(result.edits[path], where, comment) if where else None
            if text is not None:
                result.edits[path] = text
                restored.setdefault(path, []).append(comment.strip())
    return restored


def _port_upstreams(
    base: Sources,
    tree: Sources,
    result: FamilyResult,
    port: Porter,
    items: list[Inconsistency],
    restored: dict[str, list[str]],
    tried: set[str],
) -> bool:
    """A port changed definitions that copy another file's (the port threads what the upstream does not yet): port
    the upstream too, so that the restored marker holds again rather than being lost (codegen's blocks copy
    GPT-J's). True when an upstream was ported."""
    lines = {item.marker.path: copies.split_lines(result.edits.get(item.marker.path, "")) for item in items}
    ported_any = False
    for item in items:
        marker_line = lines[item.marker.path][item.marker.line].strip() if item.marker.line < len(lines[item.marker.path]) else ""
        if marker_line not in restored.get(item.marker.path, []) or item.marker.test:
            continue
        found = module_path(item.marker.target, tree)
        if found is None or found[0] in tried:
            continue
        upstream = found[0]
        tried.add(upstream)
        answer = port(upstream, base.read(upstream) or "")
        if answer.source is None:
            result.note(item.marker.path, f"could not port its upstream {upstream} ({answer.detail})")
            continue
        result.edits[upstream] = answer.source
        result.family.append(upstream)
        lost = removed_markers(base.read(upstream) or "", answer.source, upstream)
        for where, comments in _restore_markers(base, result, {upstream: lost}).items():
            restored.setdefault(where, []).extend(comments)
        result.note(upstream, f"ported as the upstream of {item.marker.path}, whose copies of it the port changed")
        ported_any = True
    return ported_any


def _drop_restored(
    result: FamilyResult, restored: dict[str, list[str]], stale: list[Inconsistency]
) -> list[Inconsistency]:
    """Remove again the restored markers that do not hold; note the ones that do."""
    remaining = []
    dropped: dict[str, set[str]] = {}
    for item in stale:
        lines = copies.split_lines(result.edits.get(item.marker.path, ""))
        text = lines[item.marker.line].strip() if item.marker.line < len(lines) else ""
        if text in restored.get(item.marker.path, []):
            dropped.setdefault(item.marker.path, set()).add(text)
        else:
            remaining.append(item)
    for path, comments in restored.items():
        for comment in comments:
            if comment in dropped.get(path, set()):
                result.edits[path] = _drop_marker(result.edits[path], comment)
            else:
                result.note(
                    path, f"restored `{comment}` (the port had removed it): the copy matches its ported source"
                )
    return remaining


def _drop_marker(text: str, comment: str) -> str:
    lines = copies.split_lines(text)
    return "".join(line for line in lines if line.strip() != comment)


def _marked_definition(text: str, comment: str) -> tuple[str, str | None] | None:
    lines = copies.split_lines(text)
    tree = ast.parse(text)
    for index, line in enumerate(lines):
        if line.strip() == comment.strip():
            return _definition_at(tree, index + 2)
    return None


def _add_marker(text: str, where: tuple[str, str | None], comment: str) -> str | None:
    module = cst.parse_module(text)
    top, method = where
    line = cst.EmptyLine(comment=cst.Comment(comment.strip()))

    def marked(node: cst.ClassDef | cst.FunctionDef) -> cst.ClassDef | cst.FunctionDef:
        # right above `def`/`class`: the copy checker reads the definition from the line after the marker, so on a
        # decorated definition the marker goes after the decorators (where transformers puts it)
        if node.decorators:
            return node.with_changes(lines_after_decorators=[*node.lines_after_decorators, line])
        return node.with_changes(leading_lines=[*node.leading_lines, line])

    body = list(module.body)
    for index, statement in enumerate(body):
        if not isinstance(statement, (cst.ClassDef, cst.FunctionDef)) or statement.name.value != top:
            continue
        if method is None:
            body[index] = marked(statement)
            return module.with_changes(body=body).code
        if isinstance(statement, cst.ClassDef) and isinstance(statement.body, cst.IndentedBlock):
            inner = list(statement.body.body)
            for position, member in enumerate(inner):
                if isinstance(member, cst.FunctionDef) and member.name.value == method:
                    inner[position] = marked(member)
                    body[index] = statement.with_changes(body=statement.body.with_changes(body=inner))
                    return module.with_changes(body=body).code
    return None
