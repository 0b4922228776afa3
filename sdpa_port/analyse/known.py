"""What is known to hold on the SDPA path, and the branch tests it decides (pure; the tracer and the specialising
pass both use it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import all_assigned_names, assigned_values, block_body, code, single_target


@dataclass(frozen=True)
class Known:
    """Facts that hold on the SDPA path (the eager fallback handles the other cases): `falsy` names or `self.`
    attributes (`output_attentions`, `self.save_attention`), `none` parameters or `self.` attributes (`head_mask`,
    `self.head_logits_proj`)."""

    falsy: frozenset[str] = frozenset()
    none: frozenset[str] = frozenset()


Decision = Union[bool, None]


def negation(test: str) -> str:
    """The test that holds where `test` (written out, as in `Known.falsy`) does not: `self.x` for `not self.x`,
    `a != b` for `a == b`, otherwise `not test`."""
    node = cst.parse_expression(test)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        return code(node.expression)
    negated = negated_comparison(node)
    return code(negated) if negated is not None else f"not {test}"


def holds_where(alternatives: Sequence[str]) -> str:
    """Where the SDPA side of settings tests holds, written for a message: each known-false test negated, quoted and
    joined (`self.x` and `a != b`)."""
    return " and ".join(f"`{negation(side)}`" for side in alternatives)


def false_flag(test: str) -> tuple[str, bool] | None:
    """A known-false test of one flag of the module, read: `self.x` gives ("x", False) and `not self.x` gives ("x",
    True), the flag's truth where the test is false; None for any other test."""
    node = cst.parse_expression(test)
    truth = False
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        node, truth = node.expression, True
    if isinstance(node, cst.Attribute) and m.matches(node.value, m.Name("self")):
        return node.attr.value, truth
    return None


def negated_comparison(test: cst.BaseExpression) -> cst.Comparison | None:
    """`a != b` for `a == b` and the reverse; None for any other test."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    if isinstance(target.operator, cst.Equal):
        operator: cst.BaseCompOp = cst.NotEqual(
            whitespace_before=target.operator.whitespace_before, whitespace_after=target.operator.whitespace_after
        )
    elif isinstance(target.operator, cst.NotEqual):
        operator = cst.Equal(
            whitespace_before=target.operator.whitespace_before, whitespace_after=target.operator.whitespace_after
        )
    else:
        return None
    return test.with_changes(comparisons=[target.with_changes(operator=operator)])


def decide(test: cst.BaseExpression, known: Known) -> Decision:
    """True/False when the test's value follows from the known facts, None otherwise. A test is known false as
    written, and true where `not <test>` is; a known falsy comparison (`self.landmarks != self.seq_len`) also decides
    its negation, and a known falsy `not self.x` decides `self.x`."""
    if code(test) in known.falsy:  # a test known false as written (`self.x is not None`)
        return False
    if f"not {code(test)}" in known.falsy:  # and one known true (`not self.x is None`)
        return True
    negated = negated_comparison(test)
    if negated is not None:
        if code(test) in known.falsy:
            return False
        if code(negated) in known.falsy:
            return True
    if isinstance(test, cst.Name):
        if test.value in known.falsy or test.value in known.none:
            return False
        return None
    if isinstance(test, cst.Attribute):
        return False if code(test) in known.falsy else None
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = decide(test.expression, known)
        return None if inner is None else not inner
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        if isinstance(test.left, (cst.Name, cst.Attribute)) and m.matches(target.comparator, m.Name("None")):
            if code(test.left) in known.none:
                if isinstance(target.operator, cst.Is):
                    return True
                if isinstance(target.operator, cst.IsNot):
                    return False
        return None
    if isinstance(test, cst.BooleanOperation):
        left, right = decide(test.left, known), decide(test.right, known)
        if isinstance(test.operator, cst.And):
            if left is False or right is False:
                return False
            if left is True and right is True:
                return True
            return None
        if left is True or right is True:
            return True
        if left is False and right is False:
            return False
        return None
    return None


def holding(known: Known, body: Sequence[cst.BaseStatement]) -> Known:
    """The facts that hold throughout a function body: those whose names the body assigns nowhere outside the
    branches the facts themselves remove. fairseq's `if need_head_weights: need_weights = True` leaves
    `need_weights` known false when `need_head_weights` is too; assigned anywhere else, a name drops out.

    A name the body binds once, at its top level, to a test the facts decide false is known false too: `is_tpu =
    query.device.type == "xla"` with that comparison known false."""
    bound = bound_to_false(known, body)
    current = Known(falsy=known.falsy | bound, none=known.none)
    while True:
        assigned = _live_assignments(body, current) - bound
        narrowed = Known(falsy=current.falsy - assigned, none=current.none - assigned)
        if narrowed == current:
            return current
        current = narrowed


def bound_to_false(known: Known, body: Sequence[cst.BaseStatement]) -> frozenset[str]:
    """The names bound once in `body`, by a top-level `name = test` whose test the facts decide false."""
    if not known.falsy:
        return frozenset()
    values = assigned_values(body)
    out = set()
    for statement in body:
        name = single_target(statement)
        if name is None or len(values.get(name, ())) != 1:
            continue
        value = values[name][0]
        if value is not None and decide(value, known) is False:
            out.add(name)
    return frozenset(out)


def _live_assignments(statements: Sequence[cst.BaseStatement], known: Known) -> frozenset[str]:
    names: set[str] = set()
    for statement in statements:
        branch: cst.If | cst.Else | None = statement if isinstance(statement, cst.If) else None
        if branch is None:
            names |= all_assigned_names([statement])
            continue
        while branch is not None:
            if isinstance(branch, cst.Else):
                names |= _live_assignments(block_body(branch.body), known)
                break
            decision = decide(branch.test, known)
            if decision is not False:
                names |= all_assigned_names([branch.test]) | _live_assignments(block_body(branch.body), known)
            if decision is True:
                break
            branch = branch.orelse
    return frozenset(names)
