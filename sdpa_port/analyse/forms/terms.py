"""Additive terms of the scores: a mask, a position bias, ALiBi, relative scores, a helper's terms.

Relative scores come from another product (`scores + relative_scores`: the younger chain becomes the term); a
subtracted term is added negated (`scores - term` is `scores + (-term)`); a helper of the file that only adds terms
that do not depend on the scores reads as one (`helper(scores, ...)` is `scores + helper(zeros, ...)`). Whether only `x
is not None` tests of the term's own names enclose it (it is then always given when given), and whether it may be the
number 0 on some path, are noted. A term added after the softmax is refused S106; the scores added to themselves, S103;
a term that reads the scores, S104.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.additive import additive_in
from sdpa_port.analyse.chain import SCORES, AddTerm, ChainVal, Op, Poison, short
from sdpa_port.analyse.cstutil import nodes_of_type, primary
from sdpa_port.analyse.forms.common import Example, scored, sdpa
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def added(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    """A term added to or subtracted from the scores.

    `scores + term`, `term + scores`, and `scores - term` (the term negated: `x - t` is `x + (-t)` exactly).
    """
    if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, (cst.Add, cst.Subtract)):
        return None
    left_refs, right_refs = tracer.chain_or_start(node.left), tracer.chain_or_start(node.right)
    subtract = isinstance(node.operator, cst.Subtract)
    if not left_refs and not right_refs or subtract and not left_refs:
        return None  # `term - scores` negates the scores: not a term
    if left_refs and right_refs:
        return None if subtract else add_two_chains(tracer, node, line)
    chain_side, other = (node.left, node.right) if left_refs else (node.right, node.left)
    base, ops = tracer.decompose(chain_side, line)
    current = tracer.chains.advance(base, ops)
    return base, [*ops, add_term(tracer, current, other, line, negate=subtract)]


def additive_helper(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    """A helper called on the scores that only adds terms not depending on them.

    `helper(scores, ...)`, a function of this file or a method of the class: the term is `helper(zeros, ...)`.
    """
    if not isinstance(node, cst.Call) or not tracer.reads.chain_value_refs(node):
        return None
    function: cst.FunctionDef | None = None
    skip = 0
    if isinstance(node.func, cst.Name):
        function = tracer.facts.functions.get(node.func.value)
    elif m.matches(node.func, m.Attribute(value=m.Name("self"))) and tracer.scope.class_name is not None:
        assert isinstance(node.func, cst.Attribute)
        found = tracer.facts.find_method(tracer.scope.class_name, node.func.attr.value)
        function, skip = (found[1], 1) if found is not None else (None, 0)
    if function is None or any(a.star for a in node.args):
        return None
    chained = [i for i, a in enumerate(node.args) if tracer.reads.chain_value_refs(a.value)]
    if len(chained) != 1:
        return None
    index = chained[0]
    argument = node.args[index]
    params = [*function.params.posonly_params, *function.params.params][skip:]
    if argument.keyword is not None:
        parameter = argument.keyword.value
    elif index < len(params):
        parameter = params[index].name.value
    else:
        return None
    shape = additive_in(function, parameter)
    if shape is None:
        return None
    base, ops = tracer.decompose(argument.value, line)
    current = tracer.chains.advance(base, ops)
    if current.stage is not SCORES:
        return None
    if shape.in_place:
        _no_other_holder(tracer, node, argument.value, base)
    if shape.reshaped and (shape.rank is None or shape.rank != current.rank):
        raise Poison(Code.LAYOUT, f"`{short(node.func)}` returns the scores in another shape", {base.cid})
    args = list(node.args)
    args[index] = argument.with_changes(value=cst.Name("None"))
    term = tracer.reads.detach(node.with_changes(args=args), base.cid)
    applied = always_applied(tracer, term), always_applied(tracer, term, base.cid)
    setting = setting_applied(tracer, term, base.cid)
    return base, [*ops, AddTerm(term, current.rank, *applied, setting, scores_arg=index)]


def _no_other_holder(tracer: TracerView, call: cst.Call, argument: cst.BaseExpression, base: ChainVal) -> None:
    """A helper adding to the scores' own entries changes them under every name that holds that tensor: in

        other = scores
        scores = add_bias(scores, bias)   # `scores[..., 1:] += bias` inside
        ... softmax(other) ...

    `other` holds the scores with the bias added once more than the chain says. Where any name but the argument's
    holds a value of the chain, the call is refused: which of them share the tensor the text does not tell."""
    passed = argument.value if isinstance(argument, cst.Name) else None
    others = sorted(
        name
        for name, value in tracer.env.items()
        if name != passed and isinstance(value, ChainVal) and value.cid == base.cid
    )
    if others:
        raise Poison(
            Code.SCORES_READ,
            f"`{short(call.func)}` adds to the scores in place, and `{others[0]}` may hold the same tensor",
            {base.cid},
        )


def add_term(
    tracer: TracerView, current: ChainVal, term: cst.BaseExpression, line: int, negate: bool = False
) -> AddTerm:
    """The term added to the scores.

    With `negate`, subtracted: the term is then `-(term)`.
    """
    if current.stage != SCORES:
        raise Poison(
            Code.PROBABILITIES_CHANGED, "a term is added to the probabilities after the softmax", {current.cid}
        )
    if tracer.reads.chain_value_refs(term):
        raise Poison(Code.SCORES_READ, f"the additive term `{short(term)}` depends on the scores", {current.cid})
    detached = tracer.reads.detach(term, current.cid)
    return AddTerm(
        cst.UnaryOperation(cst.Minus(), primary(detached)) if negate else detached,
        current.rank,
        always_applied(tracer, term),
        always_applied(tracer, term, current.cid),
        setting_applied(tracer, term, current.cid),
        may_be_number=may_be_number(tracer, term),
        term_rank=tracer.ranks.rank_of(term),
    )


def may_be_number(tracer: TracerView, term: cst.BaseExpression) -> bool:
    """A local that holds a number literal on some path, or a term that is a conditional with a number arm.

    Directly, as an arm of a conditional (`bias = 0.0 if mask is None else mask`), or as what a method of the module
    returns (a name the method returns that it assigns a number somewhere: `score = 0`, then `score += ...` under
    tests).
    """
    if number_arm(term):
        return True
    if not isinstance(term, cst.Name):
        return False
    for value in tracer.scope.local_values(term.value):
        if number_arm(value):
            return True
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
            continue
        if not (isinstance(value.func.value, cst.Name) and value.func.value.value == "self"):
            continue
        found = tracer.facts.find_method(tracer.class_name, value.func.attr.value) if tracer.class_name else None
        if found is not None and _returns_a_number(found[1]):
            return True
    return False


def number_arm(value: cst.BaseExpression) -> bool:
    """A number literal, or an expression that may evaluate to one of its arms that is (`0.0 if mask is None else
    mask`, `mask or 0.0`)."""
    if p.number(value) is not None:
        return True
    if isinstance(value, cst.IfExp):
        return number_arm(value.body) or number_arm(value.orelse)
    if isinstance(value, cst.BooleanOperation):
        return number_arm(value.left) or number_arm(value.right)
    return False


def always_applied(tracer: TracerView, term: cst.BaseExpression, cid: int | None = None) -> bool:
    """Only `x is not None` tests of the term's own names enclose it.

    An `else` branch counts as a condition. With the chain's `cid`: whenever that chain runs, the branches enclosing
    its query-key product aside (`if self.training and fused: ... else: <the chain>`).
    """
    path, tests = _enclosing(tracer, cid)
    if len(tests) != len(path):
        return False
    names = p.walk_names(term)
    for test in tests:
        checked = _only_not_none(test)
        if checked is None or not checked <= names:
            return False
    return True


def setting_applied(tracer: TracerView, term: cst.BaseExpression, cid: int) -> cst.BaseExpression | None:
    """The test of the module's settings alone under which the term is added whenever the chain runs.

    And its operands are not None: every branch enclosing it (past those enclosing the chain's product) is the first of
    its `if`, and each part of its test joined by `and` is an `x is not None` of the term's names or reads the settings
    alone (`self.use_mask`); those parts joined, or None where no part reads a setting or another part is found.
    """
    path, tests = _enclosing(tracer, cid)
    if len(tests) != len(path) or any(index != 0 for _, index in path):
        return None
    names = p.walk_names(term)
    settings: list[cst.BaseExpression] = []
    for part in (part for test in tests for part in p.conjuncts(test)):
        checked = _only_not_none(part)
        if checked is not None and checked <= names:
            continue
        if not tracer.reads_settings(part):
            return None
        settings.append(part)
    return p.joined(settings) if settings else None


def _enclosing(tracer: TracerView, cid: int | None) -> tuple[list[tuple[int, int]], list[cst.BaseExpression]]:
    """The branches enclosing the current statement and their if/elif tests.

    Each branch is (id of its `if`, index). With a chain's `cid`, only those past the ones enclosing its query-key
    product.
    """
    path, tests = tracer.path, tracer.tests
    if cid is not None and 0 <= cid < len(tracer.chains.candidates):
        candidate = tracer.chains.candidates[cid]
        shared = len(candidate.start_path)
        if tuple(path[:shared]) == candidate.start_path:
            return path[shared:], tests[candidate.start_tests :]
    return path, tests


def add_two_chains(tracer: TracerView, node: cst.BinaryOperation, line: int) -> tuple[ChainVal, list[Op]]:
    """`scores + relative_scores`: the chain that continues is the older one; the other is an additive term."""
    left_cids, right_cids = tracer.chain_or_start(node.left), tracer.chain_or_start(node.right)
    if len(left_cids | right_cids) != 2 or left_cids & right_cids:
        raise Poison(Code.SCORES_COMBINED, "the scores are added to themselves", left_cids | right_cids)

    def age(cids: set[int]) -> float:
        return min(cids) if min(cids) >= 0 else float("inf")  # a product starting here is the newest

    main_left = age(left_cids) < age(right_cids)
    chain_side, other = (node.left, node.right) if main_left else (node.right, node.left)
    absorbed = right_cids if main_left else left_cids
    for cid in absorbed:
        if cid >= 0:
            tracer.chains.candidates[cid].absorbed = True
    base, ops = tracer.decompose(chain_side, line)
    current = tracer.chains.advance(base, ops)
    return base, [*ops, AddTerm(other, current.rank)]


def _only_not_none(test: cst.BaseExpression) -> set[str] | None:
    """The names of a test made only of `x is not None` joined by `and`, else None."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        left, right = _only_not_none(test.left), _only_not_none(test.right)
        return None if left is None or right is None else left | right
    if m.matches(
        test,
        m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))]),
    ):
        return {test.left.value}  # type: ignore[attr-defined]
    return None


def _returns_a_number(function: cst.FunctionDef) -> bool:
    """Some return of the function is a number literal, or a name the function assigns a number literal."""
    returns = [node.value for node in nodes_of_type(function, cst.Return) if node.value is not None]
    numbers: set[str] = set()
    for assign in nodes_of_type(function, cst.Assign):
        if p.number(assign.value) is not None:
            numbers.update(t.target.value for t in assign.targets if isinstance(t.target, cst.Name))
    return any(
        p.number(value) is not None or (isinstance(value, cst.Name) and value.value in numbers) for value in returns
    )


EXAMPLES = {
    "added": (
        Example(
            scored("if attention_mask is not None:\n    scores = scores + attention_mask\nprobs = scores.softmax(-1)"),
            AddTerm,
            becomes=sdpa("attn_mask=attention_mask", "scale=1.0"),  # None when the term is not added
        ),
        # relative scores from a second product: the younger chain is a term
        Example(
            scored("scores = scores + query @ attention_mask.transpose(-1, -2)\nprobs = scores.softmax(-1)"),
            AddTerm,
            becomes=sdpa("attn_mask=query @ attention_mask.transpose(-1, -2)", "scale=1.0"),
        ),
        Example(scored("probs = scores.softmax(-1) + attention_mask"), refused=Code.PROBABILITIES_CHANGED),
        # a subtracted term is the term negated
        Example(
            scored("if attention_mask is not None:\n    scores = scores - 1e4 * (1.0 - attention_mask)\nprobs = scores.softmax(-1)"),
            AddTerm,
            becomes="sdpa_mask = None\nif attention_mask is not None:\n    sdpa_mask = -(1e4 * (1.0 - attention_mask))\n"
            + "return "
            + sdpa("attn_mask=sdpa_mask", "scale=1.0"),
        ),
        # the scores subtracted from a term are negated: no term
        Example(scored("scores = attention_mask - scores\nprobs = scores.softmax(-1)"), refused=Code.SCORES_COMBINED),
        Example(
            scored("scores = scores + scores.mean(-1, keepdim=True)\nprobs = scores.softmax(-1)"),
            refused=Code.SCORES_COMBINED,
        ),
        # a term cast to the scores' type reads their dtype and device, which are the query's, not their values
        Example(
            scored("scores = scores + attention_mask.type_as(scores)\nprobs = scores.softmax(-1)"),
            AddTerm,
            becomes=sdpa("attn_mask=attention_mask.type_as(query)", "scale=1.0"),
        ),
        Example(
            scored("scores = scores + attention_mask.to(scores)\nprobs = scores.softmax(-1)"),
            AddTerm,
            becomes=sdpa("attn_mask=attention_mask.to(query)", "scale=1.0"),
        ),
        # the scores cast to the term's type are the scores
        Example(
            scored("scores = scores + scores.type_as(attention_mask)\nprobs = scores.softmax(-1)"),
            refused=Code.SCORES_COMBINED,
        ),
        # the cast on a line of its own is no operand of the chain: the statement would read scores SDPA never makes
        Example(
            scored("mask = attention_mask.type_as(scores)\nscores = scores + mask\nprobs = scores.softmax(-1)"),
            refused=Code.SCORES_READ,
        ),
    ),
    "additive_helper": (
        # a computed argument: the wrapper form does not inline this call, this one reads the helper
        Example(
            scored("scores = self.add_bias(scores, attention_mask.float())\nprobs = scores.softmax(-1)"),
            AddTerm,
            methods="def add_bias(self, scores, bias):\n    return scores + bias",
            # the helper adds the term to zeros of the scores' shape
            becomes="scores_shape = query.shape[:-1] + key.shape[-2:-1]\n"
            + "return "
            + sdpa("attn_mask=self.add_bias(key.new_zeros(scores_shape), attention_mask.float())", "scale=1.0"),
        ),
        Example(
            scored("scores = self.add_bias(scores, attention_mask.float())\nprobs = scores.softmax(-1)"),
            refused=Code.SCORES_TRANSFORMED,
            methods="def add_bias(self, scores, bias):\n    return scores.tanh() + bias",
        ),
        # terms added in place to a slice of the scores (past a class token), which the helper returns
        Example(
            scored("scores = self.add_bias(scores, attention_mask)\nprobs = scores.softmax(-1)"),
            AddTerm,
            methods="def add_bias(self, scores, bias):\n    scores[:, :, 1:, 1:] = scores[:, :, 1:, 1:] + bias\n"
            + "    return scores",
            becomes="scores_shape = query.shape[:-1] + key.shape[-2:-1]\n"
            + "return "
            + sdpa("attn_mask=self.add_bias(key.new_zeros(scores_shape), attention_mask)", "scale=1.0"),
        ),
        # the caller's name for the scores the helper changed in place, read after it: the older value is gone
        Example(
            scored("biased = self.add_bias(scores, attention_mask)\nprobs = scores.softmax(-1)"),
            refused=Code.SCORES_READ,
            methods="def add_bias(self, scores, bias):\n    scores[:, :, 1:, 1:] = scores[:, :, 1:, 1:] + bias\n"
            + "    return scores",
        ),
        Example(
            scored("scores = self.add_bias(scores, attention_mask)\nprobs = scores.softmax(-1)"),
            refused=Code.SCORES_TRANSFORMED,
            methods="def add_bias(self, scores, bias):\n    scores[:, :, 1:, 1:] = scores[:, :, 1:, 1:] * bias\n"
            + "    return scores",
        ),
    ),
}
