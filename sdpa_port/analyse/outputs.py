"""Trace the product of a chain's probabilities with V, and what a statement may do with the weights after it.

`find_output` finds the product in an expression; `output_statement` records it as the chain's `Output`, a second
product with the same probabilities as an SDPA call of its own. After it, a statement may pass the weights along
(`return output, weights`) and nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import (
    OUT,
    PROBS,
    ChainVal,
    Op,
    Dropout,
    NotChain,
    Output,
    OutputStmt,
    Poison,
    Transpose,
    describe_layout,
)
from sdpa_port.analyse.chain_book import Products
from sdpa_port.analyse.chain_reads import ProductFinder, ReadFinder, contains_softmax
from sdpa_port.analyse.patterns.single_query import SingleQueryOutput, single_query_output
from sdpa_port.analyse.remakes import Made
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView


def find_output(tracer: TracerView, value: cst.BaseExpression) -> tuple[cst.BaseExpression, p.Product] | None:
    """A product whose left operand is the probabilities, anywhere inside the expression."""
    finder = ProductFinder(tracer.scope)
    value.visit(finder)
    for node, product in finder.found:
        probabilities = probabilities_operand(tracer, product)
        refs = tracer.reads.chain_refs(probabilities)
        if not refs and not (tracer.selected_start is None and contains_softmax(probabilities, tracer.scope)):
            continue
        try:
            base, ops = tracer.decompose(probabilities, 0)
        except NotChain:
            continue
        except Poison as poison:
            # a chain reaches this product through an operation SDPA cannot follow: it is attention all the
            # same, refused with that operation as the reason
            for cid in poison.cids:
                tracer.chains.candidates[cid].poisoned(poison.reason.code, poison.reason.detail, tracer.current_line)
                tracer.chains.candidates[cid].stage = OUT
            continue
        advanced = tracer.chains.advance(base, ops)
        if advanced.stage == PROBS:
            start = tracer.chains.candidates[base.cid].start
            if start is not None and start.single:
                if single_output_roles(product, probabilities is product.left, advanced.rank) is None:
                    # the probabilities of one query per head reach a product that does not sum over their keys
                    tracer.chains.candidates[base.cid].poisoned(
                        Code.LAYOUT,
                        "the single-query probabilities reach a product with V that is not an einsum summing over "
                        "their keys",
                        tracer.current_line,
                    )
                    tracer.chains.candidates[base.cid].stage = OUT
                    continue
                return node, product
            if product.form is p.ProductForm.EINSUM:
                if p.einsum_roles(product.spec or "", p.EinsumRole.OUTPUT, tracer.chains.layout_of(base.cid)) is None:
                    continue
            return node, product
    return None


def probabilities_operand(tracer: TracerView, product: p.Product) -> cst.BaseExpression:
    """The operand of a product with V that holds the probabilities: the left one, or the right one where only it
    reads a chain, one a query-key product started (`torch.bmm(value, probs.permute(0, 2, 1))`,
    `forms/transposed.py`; a router's `outputs @ softmax(logits)` is no attention)."""
    if tracer.reads.chain_refs(product.left):
        return product.left
    if product.form is p.ProductForm.EINSUM:
        # an einsum's operands commute: only single-query probabilities are read on its right (`single_output_roles`)
        single = [cid for cid in tracer.reads.chain_refs(product.right) if _single(tracer, cid)]
        return product.right if single else product.left
    started = [cid for cid in tracer.reads.chain_refs(product.right) if tracer.chains.candidates[cid].start is not None]
    return product.right if started else product.left


def output_statement(
    tracer: TracerView,
    small: cst.CSTNode,
    value: cst.BaseExpression,
    found: tuple[cst.BaseExpression, p.Product],
    names: list[str],
    depth: int,
    line: int,
) -> None:
    """Record a statement holding the product of a chain's probabilities with V.

    `found` is the product and its node.
    """
    node, product = found
    probabilities_node = probabilities_operand(tracer, product)
    value_left = probabilities_node is not product.left and product.form is not p.ProductForm.EINSUM
    value_node = product.right if probabilities_node is product.left else product.left
    try:
        base, ops = tracer.decompose(probabilities_node, line)
    except (NotChain, Poison) as error:  # pragma: no cover - find_output checked the operand
        raise AssertionError(str(error))
    advanced = tracer.chains.advance(base, ops)
    if advanced.stage != PROBS:
        tracer.chains.candidates[base.cid].poisoned(Code.SOFTMAX_DIM, "the scores reach the product with V without a softmax", line)
    probabilities = tracer.chains.remakes.key(base, probabilities_node, tracer.env, tracer.assignments, tracer.branches)
    draw = next(tracer.chains.steps) if any(isinstance(op, Dropout) for op in ops) else tracer.chains.remakes.draw(base.step)
    again = tracer.chains.candidates[base.cid].stage == OUT
    taken = tracer.chains.products.get(base.cid)
    if again:
        second_output(tracer, base.cid, taken, probabilities, draw, line)
    if taken is None:
        taken = tracer.chains.products[base.cid] = Products(probabilities)
    taken.paths.append(tuple(tracer.path))
    if tracer.reads.chain_refs(value_node):
        tracer.chains.candidates[base.cid].poisoned(Code.VALUE_SIDE, "the value operand depends on the scores", line)
    rank = product.rank if product.rank is not None else base.rank
    layout = tracer.chains.layout_of(base.cid)
    order = value_order = value_left_order(tracer, base.cid, ops, value_left, rank, line)
    operand = p.permuted(value_node, order)
    shared = single = False
    if _single(tracer, base.cid):
        single_roles = single_output_roles(product, probabilities_node is product.left, advanced.rank)
        assert single_roles is not None  # find_output read the product so
        rank, order, value_order, single = single_roles.rank, single_roles.result, single_roles.value, True
        operand = p.permuted(value_node, value_order)
    elif product.form is p.ProductForm.EINSUM:
        roles = p.einsum_roles(product.spec or "", p.EinsumRole.OUTPUT, layout)
        if roles:
            rank, order, value_order = roles.rank, roles.result, roles.right
            operand = p.permuted(product.right, value_order)
            if roles.shared is not None:
                operand, shared = shared_value(tracer, base.cid, operand, roles.shared, line), True
    elif layout is not None:
        tracer.chains.candidates[base.cid].poisoned(
            Code.LAYOUT,
            f"the probabilities, laid out {describe_layout(layout)}, are multiplied by V as if they were laid out "
            "(batch, heads, query, key)",
            line,
        )
    output = Output(product, node, operand, rank, order, value_order, value_left, shared, single)
    # a further product with the same probabilities records only itself: its SDPA call repeats the first's
    tracer.chains.record(base, [output] if again else [*ops, output], depth, line)
    holders = frozenset(n for n, v in tracer.env.items() if isinstance(v, ChainVal) and v.step == base.step)
    tracer.plans[small] = OutputStmt([] if again else list(ops), output, depth, line, holders)
    taken.draws.append(draw)
    taken.statements.append((small, base.step))
    candidate = tracer.chains.candidates[base.cid]
    candidate.stage = OUT
    tracer.output_seen = True
    # the rest of the statement may only pass the weights along (`return output, weights`)
    for name, read in tracer.reads.chain_names_in(value, exclude=node):
        value_of = tracer.env.get(name)
        if isinstance(value_of, ChainVal) and value_of.stage == PROBS and weights_passed_along(tracer, value, node):
            tracer.probs_after_output.add(name)
        else:
            candidate.poisoned(Code.VALUE_SIDE, f"the statement with the product with V also reads `{name}`", line)
    for name in names:
        tracer.env.pop(name, None)
    tracer.note_assignment(names)


def value_left_order(
    tracer: TracerView, cid: int, ops: list[Op], value_left: bool, rank: int | None, line: int
) -> p.Order | None:
    """How a value on the left of the probabilities is transposed for SDPA, and its output back; None otherwise.

    `value @ probs^T` is `(probs @ value^T)^T`: the probabilities must have been transposed last (`Transpose`) exactly
    when the value is on their left, and their rank known."""
    # an earlier product with V of the same probabilities (another arm's) changed nothing of their layout
    recorded = [op for op, _, _ in tracer.chains.candidates[cid].ops if not isinstance(op, Output)]
    transposed = bool(ops or recorded) and isinstance([*recorded, *ops][-1], Transpose)
    if transposed != value_left:
        detail = (
            "the value multiplies the probabilities from the left, which are not transposed"
            if value_left
            else "the transposed probabilities multiply the value from the left"
        )
        tracer.chains.candidates[cid].poisoned(Code.LAYOUT, detail, line)
        return None
    if not value_left:
        return None
    if rank is None:
        detail = "the value multiplies the probabilities from the left, and their rank cannot be read"
        tracer.chains.candidates[cid].poisoned(Code.LAYOUT, detail, line)
        return None
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


def second_output(
    tracer: TracerView, cid: int, taken: Products | None, probabilities: Made, draw: int | None, line: int
) -> None:
    """Check a further product with V of a chain's probabilities, an SDPA call of its own.

    It has the same query, key, mask and scale (LiLT's text and layout values), where the probabilities are those the
    first product took, made the same way, and, if dropped out, by a draw of their own (each SDPA call draws its own
    dropout).
    """
    if taken is not None and exclusive_arm(taken, probabilities, tuple(tracer.path), tracer.chains.returned_arms):
        return  # one of the products runs, whichever arm of the `if` is taken: one SDPA call, one draw
    if taken is None or probabilities != taken.probabilities:
        tracer.chains.candidates[cid].poisoned(Code.VALUE_SIDE, "the probabilities are multiplied by a second tensor", line)
    elif draw is not None and draw in taken.draws:
        tracer.chains.candidates[cid].poisoned(
            Code.VALUE_SIDE,
            "one dropout draw of the probabilities reaches two products with V (SDPA calls draw their own)",
            line,
        )


def exclusive_arm(
    taken: Products, probabilities: Made, path: tuple[tuple[int, int], ...], returned: set[tuple[int, int]]
) -> bool:
    """A further product with V that never runs in a call where an earlier one ran.

    `if self.use_proj: out = self.proj(probs @ v) else: out = probs @ v`, or `if self.use_proj: return self.proj(probs
    @ v)` then `return probs @ v`: the probabilities are made the same way before the `if` (the same place on the
    chain, the same expression and bindings), and each earlier product sits in another arm of an `if` enclosing this
    one, or in an arm ending in a `return` of an `if` this one follows. At most one of them runs, with whatever
    dropout draw they share. `returned`: the arms ending in a `return`, as `(id(if), index)`.
    """
    first, made = taken.probabilities, probabilities
    # the same expression reads the same names: a name only one of them binds is read by its branches' tests
    common = dict(first.bindings).keys() & dict(made.bindings).keys()
    same = (made.cid, made.base, made.expression) == (first.cid, first.base, first.expression)
    bound = [b for b in made.bindings if b[0] in common] == [b for b in first.bindings if b[0] in common]
    return same and bound and all(_apart(earlier, path, returned) for earlier in taken.paths)


def _apart(
    first: tuple[tuple[int, int], ...], second: tuple[tuple[int, int], ...], returned: set[tuple[int, int]]
) -> bool:
    """Two places on the trace's path of `if` arms, the second traced later, that never run in one call: in two arms of
    one `if`, or the first in an arm that returns of an `if` the second is outside of."""
    arms, inside = dict(second), {node for node, _ in second}
    return any(
        (node in arms and arms[node] != index) or (node not in inside and (node, index) in returned)
        for node, index in first
    )


def reads_only_weights(tracer: TracerView, node: cst.CSTNode) -> bool:
    """After the product with V, a statement that reads the probabilities only passes the weights along."""
    if not tracer.output_seen:
        return False
    finder = ReadFinder(tracer.env, None)
    node.visit(finder)
    values = [tracer.env[n.value] for n in finder.values_read()]
    return bool(values) and all(isinstance(v, ChainVal) and v.stage in (PROBS, OUT) for v in values)


def weights_passed_along(tracer: TracerView, node: cst.BaseExpression, exclude: cst.CSTNode | None = None) -> bool:
    """The probabilities appear only as themselves, in tuples, or as either side of a conditional expression."""
    if node is exclude or isinstance(node, cst.Name):
        return True
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(weights_passed_along(tracer, e.value, exclude) for e in node.elements)
    if isinstance(node, cst.IfExp):
        return not tracer.reads.chain_value_refs(node.test) and all(
            weights_passed_along(tracer, part, exclude) for part in (node.body, node.orelse)
        )
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return weights_passed_along(tracer, node.left, exclude) and weights_passed_along(tracer, node.right, exclude)
    found = p.method_call(node, {"reshape", "view", "transpose", "permute", "contiguous"})
    if found is not None and asked_for_weights(tracer):
        # laid out for the caller under `if output_attentions:`, a path SDPA leaves to eager
        assert isinstance(node, cst.Call)
        return weights_passed_along(tracer, found[0], exclude) and not any(
            tracer.reads.chain_value_refs(a.value) for a in node.args
        )
    if exclude is not None:
        finder = ReadFinder(tracer.env, exclude)
        node.visit(finder)
        return not finder.values_read()
    return not tracer.reads.chain_value_refs(node)


def asked_for_weights(tracer: TracerView) -> bool:
    """An enclosing `if` tests `output_attentions` itself."""
    return any(m.matches(test, m.Name("output_attentions")) for test in tracer.tests)


def shared_value(tracer: TracerView, cid: int, value: cst.BaseExpression, axis: int, line: int) -> cst.BaseExpression:
    """A value shared by every head (`bhij,bjd->bhid`), expanded to the heads of the query its chain's key was
    expanded to; refused where the key has heads of its own, which the value's do not follow."""
    start = tracer.chains.candidates[cid].start
    heads = start.heads if start is not None else None
    if heads is None:
        tracer.chains.candidates[cid].poisoned(
            Code.LAYOUT, "the value is shared by every head, and the key is not: both shared are read, or neither", line
        )
        return value
    return p.expanded(value, axis, heads, 4)


def _single(tracer: TracerView, cid: int) -> bool:
    """The chain's product is single-query (`Start.single`)."""
    start = tracer.chains.candidates[cid].start
    return start is not None and start.single


def single_output_roles(product: p.Product, probabilities_left: bool, rank: int | None) -> SingleQueryOutput | None:
    """The product with V of single-query probabilities of that rank: an einsum read so, with the probabilities on
    the side it reads them (`patterns/single_query.py`); None for any other product."""
    if product.form is not p.ProductForm.EINSUM or rank is None:
        return None
    roles = single_query_output(product.spec or "", rank)
    return roles if roles is not None and roles.probabilities_left == probabilities_left else None
