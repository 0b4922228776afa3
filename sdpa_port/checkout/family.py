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

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from sdpa_port.checkout import copies
from sdpa_port.checkout.copies import Formatter, Inconsistency
from sdpa_port.checkout.follow import apply_follow, follow_plan
from sdpa_port.checkout.markers import add_marker, drop_marker, marked_definition, removed_markers
from sdpa_port.checkout.tree import Overlay, Sources, module_path, relative_module


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
            plan = [follow_plan(item, tree, text, marker_only=is_port) for item in items]
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
                updated = apply_follow(followed, follow, tree, formatter)
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
    """The files with a marker naming a module among `changed`, and those files themselves."""
    needles = tuple(f"transformers.{m}." for m in (relative_module(p) for p in changed) if m)
    out = set(changed)
    for path in tree.paths():
        text = tree.read(path)
        if text is not None and "Copied from" in text and any(n in text for n in needles):
            out.add(path)
    return sorted(p for p in out if p.endswith(".py"))


class _Baseline:
    """The inconsistencies each file had before any port, checked on demand once per file."""

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


def _restore_markers(base: Sources, result: FamilyResult, removed: dict[str, list[str]]) -> dict[str, list[str]]:
    """Put the markers a port removed back on their definitions, to be judged with the others.

    Returns path -> the markers put back.
    """
    restored: dict[str, list[str]] = {}
    for path, comments in removed.items():
        original = base.read(path)
        if path not in result.edits or original is None:
            continue
        for comment in comments:
            where = marked_definition(original, comment)
            text = add_marker(result.edits[path], where, comment) if where else None
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
    """Port the upstreams whose copies a port changed, so that restored markers hold, and say whether one was.

    The port threads what the upstream does not yet: porting the upstream too lets the restored marker hold again
    rather than be lost (codegen's blocks copy GPT-J's).
    """
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
                result.edits[path] = drop_marker(result.edits[path], comment)
            else:
                result.note(
                    path, f"restored `{comment}` (the port had removed it): the copy matches its ported source"
                )
    return remaining
