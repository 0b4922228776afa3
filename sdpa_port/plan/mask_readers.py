"""Decide how a module that reads its mask itself gets eager's form of it under every implementation it runs on.

T5 (before transformers ported it by hand) adds the mask to its position bias in its own forward and hands the
sum over as one term. Under sdpa, transformers builds that mask as booleans or None, and the sum is then wrong: a
boolean adds 1 where it keeps, None drops the causality. The rule: when the code that stays in a moved module's
forward reads a mask parameter, every mask the file builds is converted to eager's form where it is built
(`rewrite/eager_masks.py`), so each module sees what eager saw. That holds only where every builder call of the
file can be converted and no implementation but eager and sdpa is claimed (their masks have no eager form);
otherwise the file is refused (M206).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.built_masks import BuiltMasks, built_masks
from sdpa_port.analyse.cstutil import all_assigned_names, block_body
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.none_safety import not_none_names
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.layout import fresh_name

FUNCTION = "eager_attention_mask"
DISPATCH = "attention_interface"  # the name the dispatch binds the implementation to (`dispatch.py.jinja`)


@dataclass(frozen=True)
class EagerMasks:
    """Every mask builder of the file gives eager's form, through the module-level function `function`."""

    function: str
    owners: frozenset[str]  # the classes whose builders are converted
    lines: tuple[int, ...]  # the builder calls converted
    readers: tuple[tuple[str, str], ...]  # (class, mask parameter) that read their mask themselves

    def warning(self) -> str:
        lines = ", ".join(str(line) for line in self.lines)
        return (
            "; ".join(f"{owner} reads `{name}` itself" for owner, name in self.readers)
            + f": the masks built for it (line(s) {lines}) take eager's form under every implementation, so sdpa "
            "receives a float mask where it would have received booleans or None; only sdpa is claimed, "
            "`_supports_attention_backend` is not set"
        )

    def note(self) -> str:
        readers = ", ".join(owner for owner, _ in self.readers)
        lines = ", ".join(str(line) for line in self.lines)
        return f"the masks built at line(s) {lines} take eager's form ({self.function}): {readers} read(s) the mask"


@dataclass(frozen=True)
class MaskRead:
    """A mask parameter the code staying in forward computes with."""

    name: str
    # every such computation runs under `if <mask> is not None:`: sdpa's None for a mask keeping every key may stay
    # None (eager's builder makes zeros there, which add nothing)
    guarded: bool


def kept_mask_read(forward: cst.FunctionDef, introduced: frozenset[str] = frozenset()) -> MaskRead | None:
    """The mask parameter whose values the ported forward computes with (through the names it is assigned to as
    it is: renamed, sliced, cast), outside the dispatch itself; None when there is none. Renaming a mask, testing it against None and reading its
    shape do not count. The names the port introduced (`introduced`: its `dispatch_mask`, which it converts for
    eager's weights itself) are followed no further."""
    params = [p.name.value for p in (*forward.params.posonly_params, *forward.params.params, *forward.params.kwonly_params)]
    for name in params:
        if "mask" in name and "head" not in name:
            guarded = _computed_with(forward.body, name, introduced)
            if guarded is not None:
                return MaskRead(name, guarded)
    return None


def ported_mask_read(
    eager_mask_tests: Sequence[str], ported: cst.FunctionDef, forward: cst.FunctionDef
) -> MaskRead | None:
    """The mask the ported forward computes with itself (`kept_mask_read`), the names the port introduced (assigned
    in `ported`, not in `forward`) not followed; none where branches kept eager beside the dispatch take the mask
    in eager's form their own way (`EagerMask`)."""
    if eager_mask_tests:
        return None
    introduced = all_assigned_names(block_body(ported.body)) - all_assigned_names(block_body(forward.body))
    return kept_mask_read(ported, frozenset(introduced))


def _computed_with(body: cst.BaseSuite, name: str, introduced: frozenset[str]) -> bool | None:
    """Whether arithmetic outside the dispatch calls reads `name`, or a name assigned from it (to a fixed point):
    None where none does, else whether every such read is under a test that the mask is not None."""
    tainted = {name}
    while True:
        walk = _Walk(tainted, introduced)
        body.visit(walk)
        if walk.assigned <= tainted:
            return None if not walk.arithmetic else not walk.unguarded
        tainted |= walk.assigned


SHAPE_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device"})
SHAPE_METHODS = frozenset({"size", "dim", "type"})
COMBINING = frozenset({"where", "masked_fill", "masked_fill_", "add", "mul", "sub"})


class _Reads(cst.CSTVisitor):
    """Whether an expression reads a value of the tainted names (not only their shape, dtype or device)."""

    def __init__(self, tainted: set[str]) -> None:
        super().__init__()
        self.tainted = tainted
        self.found = False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if node.attr.value in SHAPE_ATTRIBUTES:
            return False
        node.value.visit(self)
        return False

    def visit_Call(self, node: cst.Call) -> bool:
        return not (isinstance(node.func, cst.Attribute) and node.func.attr.value in SHAPE_METHODS)

    def visit_Name(self, node: cst.Name) -> None:
        self.found = self.found or node.value in self.tainted


def _reads(node: cst.CSTNode, tainted: set[str]) -> bool:
    reads = _Reads(tainted)
    node.visit(reads)
    return reads.found


class _Walk(cst.CSTVisitor):
    """One pass over a forward body: the names assigned from tainted values, and whether arithmetic reads one."""

    def __init__(self, tainted: set[str], introduced: frozenset[str]) -> None:
        super().__init__()
        self.tainted = tainted
        self.introduced = introduced
        self.assigned: set[str] = set()
        self.arithmetic = False
        self.unguarded = False  # some arithmetic reading a tainted value is under no `if <tainted> is not None:`
        self.guards: list[set[str]] = []

    def _computes(self, *nodes: cst.CSTNode) -> None:
        if any(_reads(node, self.tainted) for node in nodes):
            self.arithmetic = True
            if not any(guard & self.tainted for guard in self.guards):
                self.unguarded = True

    def visit_If(self, node: cst.If) -> bool:
        node.test.visit(self)
        self.guards.append(not_none_names(node.test))
        node.body.visit(self)
        self.guards.pop()
        if node.orelse is not None:
            node.orelse.visit(self)
        return False

    def visit_Call(self, node: cst.Call) -> bool:
        if m.matches(node.func, m.Name(DISPATCH)):
            return False
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if name in COMBINING:
            self._computes(*(arg.value for arg in node.args), *([func.value] if isinstance(func, cst.Attribute) else []))
        return True

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        self._computes(node.left, node.right)

    def visit_UnaryOperation(self, node: cst.UnaryOperation) -> None:
        if not isinstance(node.operator, cst.Not):
            self._computes(node.expression)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._computes(node.target, node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        # followed: the mask under other names (renamed, sliced, cast); a value computed from it is no mask any more
        computed = _Walk(self.tainted, self.introduced)
        node.value.visit(computed)
        if _reads(node.value, self.tainted) and not computed.arithmetic:
            self.assigned |= {
                t.target.value for t in node.targets if isinstance(t.target, cst.Name) and t.target.value not in self.introduced
            }


def plan_eager_masks(
    module: cst.Module, facts: ModuleFacts, readers: Sequence[tuple[str, MaskRead]], other_implementations: bool
) -> EagerMasks | None:
    """How the builders whose masks may reach the classes in `readers` give eager's form: those in the code of the
    classes that build a reader, directly or through others (`T5Stack` builds `T5Block`, which builds the layer
    holding `T5Attention`). None where no builder of the file is among them (the masks are the model's own, or come
    from another file, as before the port); raises M206 where one cannot be converted."""
    every = built_masks(module)
    # a reader no builder of the file reaches (its masks are its model's own) keeps its code as it is
    reached = [(owner, read, _builders_of({owner}, facts)) for owner, read in readers]
    reached = [(owner, read, owners) for owner, read, owners in reached if every.of(owners) != BuiltMasks((), ())]
    if not reached:
        return None
    readers = [(owner, read) for owner, read, _ in reached]
    owners = set().union(*(owners for _, _, owners in reached))
    built = every.of(owners)
    names = ", ".join(f"{owner} reads `{read.name}`" for owner, read in readers)
    start = f"the code staying in the module's forward computes with its mask ({names}), which transformers builds per implementation"
    if other_implementations:
        raise Refuse(
            Code.MASK_READ,
            f"{start}; the file claims flash, flex or kernel support, whose masks (2-D, a BlockMask, none) have no eager form",
        )
    unguarded = next((f"{owner} reads `{read.name}`" for owner, read in readers if not read.guarded), None)
    if unguarded is not None:
        raise Refuse(
            Code.MASK_READ,
            f"{start}; {unguarded} without testing that it is not None, and sdpa's builders give None where eager's "
            "give a mask that keeps every key",
        )
    if built.unconvertible:
        line, why, _ = built.unconvertible[0]
        raise Refuse(Code.MASK_READ, f"{start}; the mask built at line {line} cannot be given eager's form: {why}", line=line)
    function = fresh_name(FUNCTION, facts.top_level_names)
    found = tuple(found.line for found in built.found)
    return EagerMasks(function, frozenset(owners), found, tuple((owner, read.name) for owner, read in readers))


def _builders_of(classes: set[str], facts: ModuleFacts) -> set[str]:
    """The classes of the file whose code builds one of `classes` (or a subclass), directly or through others."""
    found: set[str] = set()
    wanted = {name for name in facts.classes if any(info.name in classes for info in facts.mro(name))}
    while True:
        callers = facts.classes_calling(wanted | found) - found
        if not callers:
            return found
        found |= callers


__all__ = ["EagerMasks", "MaskRead", "kept_mask_read", "plan_eager_masks", "ported_mask_read"]
