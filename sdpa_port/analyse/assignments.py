"""Trace an assignment: a step of a chain, a remake of one, or a plain binding of names.

A value the recognisers of `forms/` read as a chain value with operations advances the chain (recorded once where
an earlier statement made the same value, `remakes`); anything else binds its names to what they hold off the
chain, in the tracer's environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import patterns as p

from sdpa_port.analyse.chain import ChainStmt, ChainVal, ExprVal, NotChain, Op, Poison, ScalarVal, short
from sdpa_port.analyse.cstutil import assigned_names, primary, walk_names
from sdpa_port.analyse.kept import keep_expression
from sdpa_port.analyse.outputs import find_output, output_statement, reads_only_weights, weights_passed_along
from sdpa_port.refusals import Code
from sdpa_port.rewrite.edit import replace_names

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView


def assign(
    tracer: TracerView, targets: list[cst.BaseExpression], value: cst.BaseExpression, small: cst.CSTNode, depth: int, line: int
) -> None:
    """`targets = value`: a step of a chain, a remake of one, the weights passed along, or a plain binding."""
    names = [n for t in targets for n in assigned_names(t)]
    simple = len(targets) == 1 and isinstance(targets[0], cst.Name)
    output = find_output(tracer, value)
    if output is not None:
        output_statement(tracer, small, value, output, names, depth, line)
        return
    weights_only = reads_only_weights(tracer, value)
    again = _remade(tracer, value, line) if weights_only else None  # decomposed once, used below
    if weights_only and again is None:
        if not weights_passed_along(tracer, value):
            for cid in tracer.reads.chain_value_refs(value):
                tracer.chains.candidates[cid].poisoned(
                    Code.VALUE_SIDE, f"the probabilities are used after the product with V, in `{short(value)}`", line
                )
        keep_expression(tracer, value, line, small, allow_probs=True)
        bind_plain(tracer, targets, value)
        return
    try:
        base, ops = again if again is not None else tracer.decompose(value, line)
    except NotChain:
        keep_expression(tracer, value, line, small, allow_probs=tracer.output_seen)
        bind_plain(tracer, targets, value)
        return
    except Poison as poison:
        tracer.poison_statement(poison, value, names, line)
        return
    if not simple:
        if len(targets) == 1 and isinstance(targets[0], (cst.Attribute, cst.Subscript)):
            # `self.att = F.softmax(scores, dim=-1)`: kept on the module (or in a container) for other code to read,
            # which SDPA cannot give
            stage = tracer.chains.advance(base, ops).stage.value
            where = f"the {stage} are stored in `{short(targets[0])}`, where code outside the computation may read them"
            tracer.chains.candidates[base.cid].poisoned(Code.SCORES_READ, where, line)
        else:
            tracer.chains.candidates[base.cid].poisoned(Code.LAYOUT, "the scores are unpacked into several names", line)
        for name in names:
            tracer.env[name] = base
        return
    # how the value is made: an earlier statement that made it the same way makes this one a remake (FLAVA
    # computes its softmax twice, LiLT its masked scores once per stream), the operations recorded once
    made = tracer.chains.remakes.key(base, value, tracer.env, tracer.assignments, tracer.branches) if ops else None
    remade = tracer.chains.remakes.first(made) if made is not None else None
    if remade is None:
        tracer.chains.record(base, ops, depth, line)
    tracer.plans[small] = ChainStmt(ops if remade is None else [], names, depth, line)
    after = tracer.chains.advance(base, ops)
    if ops:
        tracer.chains.remakes.note(base, after.step, ops, made, remade)
        tracer.chains.made_by[after.step] = (small, base.step, base.cid)
    tracer.env[names[0]] = after
    tracer.note_assignment(names)


def _remade(tracer: TracerView, value: cst.BaseExpression, line: int) -> tuple[ChainVal, list[Op]] | None:
    """The chain value and operations of an expression that makes again a value an earlier statement made.

    LiLT makes its probabilities after the product with its layout values, then their dropout for the text values; None
    where the expression is no such remake.
    """
    try:
        base, ops = tracer.decompose(value, line)
    except (NotChain, Poison):
        return None
    made = tracer.chains.remakes.key(base, value, tracer.env, tracer.assignments, tracer.branches)
    return (base, ops) if ops and tracer.chains.remakes.first(made) is not None else None


def bind_plain(tracer: TracerView, targets: list[cst.BaseExpression], value: cst.BaseExpression) -> None:
    """What names bound off the chain hold: an expression, each element of a tuple, `x[i]` of an unbind, a number."""
    names = [n for t in targets for n in assigned_names(t)]
    if len(targets) == 1 and isinstance(targets[0], cst.Name):
        name = targets[0].value
        previous = tracer.env.get(name)
        node = value
        if name in walk_names(value) and isinstance(previous, ExprVal):
            # `x = x * 2`: the stored expression reads the previous value of x
            node = replace_names(value, {name: previous.node})
        tracer.env[name] = ExprVal(node)
    elif (
        len(targets) == 1
        and isinstance(targets[0], cst.Tuple)
        and isinstance(value, cst.Tuple)
        and len(targets[0].elements) == len(value.elements)
    ):
        for target_element, value_element in zip(targets[0].elements, value.elements):
            if isinstance(target_element.value, cst.Name) and not isinstance(value_element, cst.StarredElement):
                tracer.env[target_element.value.value] = ExprVal(value_element.value)
            else:
                for name in assigned_names(target_element.value):
                    tracer.env.pop(name, None)
    elif len(targets) == 1 and isinstance(targets[0], cst.Tuple) and _unbound(value) is not None:
        # `q, k, v = qkv.unbind(0)`: each name holds `qkv[i]`
        source = _unbound(value)
        assert source is not None
        for index, element in enumerate(targets[0].elements):
            if isinstance(element.value, cst.Name) and not isinstance(element, cst.StarredElement):
                item = cst.Subscript(value=primary(source), slice=[cst.SubscriptElement(cst.Index(cst.Integer(str(index))))])
                tracer.env[element.value.value] = ExprVal(item)
            else:
                for name in assigned_names(element.value):
                    tracer.env.pop(name, None)
    elif len(targets) == 1 and isinstance(targets[0], cst.Tuple) and _chunked(value) is not None:
        # `q, k, v = qkv.chunk(3, dim=1)`: each name holds `qkv.chunk(3, dim=1)[i]`
        for index, element in enumerate(targets[0].elements):
            if isinstance(element.value, cst.Name) and not isinstance(element, cst.StarredElement):
                item = cst.Subscript(value=value, slice=[cst.SubscriptElement(cst.Index(cst.Integer(str(index))))])
                tracer.env[element.value.value] = ExprVal(item)
            else:
                for name in assigned_names(element.value):
                    tracer.env.pop(name, None)
    elif len(targets) == 1 and isinstance(targets[0], cst.Tuple) and _starred_shape(targets[0], value) is not None:
        # `b, c, h, w, n, d = *x.size(), self.num_heads, self.head_dim`: the shape's sizes, then the rest
        shape, count = _starred_shape(targets[0], value)  # type: ignore[misc]
        assert isinstance(value, cst.Tuple)
        for index, element in enumerate(targets[0].elements):
            assert isinstance(element.value, cst.Name)
            if index < count:
                tracer.env[element.value.value] = ScalarVal(size_of=(shape, index, count))
            else:
                tracer.env[element.value.value] = ExprVal(value.elements[index - count + 1].value)
    elif len(targets) == 1 and isinstance(targets[0], cst.Tuple) and _is_shape(value):
        # `batch, heads, length, dim = query.shape`: every name holds a number; unpacking the whole shape into
        # plain names, each is that size of the tensor (`forms/products.py` reads a channels-first map's sizes)
        elements = targets[0].elements
        whole = not isinstance(value, cst.Subscript) and all(
            isinstance(e.value, cst.Name) and not isinstance(e, cst.StarredElement) for e in elements
        )
        for name in names:
            tracer.env[name] = ScalarVal()
        if whole:
            for index, element in enumerate(elements):
                assert isinstance(element.value, cst.Name)
                tracer.env[element.value.value] = ScalarVal(size_of=(value, index, len(elements)))
    else:
        for name in names:
            tracer.env.pop(name, None)
    tracer.note_assignment(names)


def _unbound(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The `x` of `x.unbind(0)`, `x.unbind(dim=0)` or `torch.unbind(x, 0)`.

    The first dimension only.
    """
    if not isinstance(value, cst.Call):
        return None
    dims = [a for a in value.args if a.keyword is None or a.keyword.value == "dim"]
    if isinstance(value.func, cst.Attribute) and value.func.attr.value == "unbind":
        if m.matches(value.func.value, m.Name("torch")):
            source, dims = (dims[0].value, dims[1:]) if dims else (None, [])
        else:
            source = value.func.value
        if source is not None and (not dims or m.matches(dims[0].value, m.Integer("0"))) and len(dims) <= 1:
            return source
    return None


def _chunked(value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The `x` of `x.chunk(n, dim=d)` (or `x.chunk(n, d)`) with literal arguments, split along one dimension."""
    found = p.method_call(value, {"chunk"})
    if found is None or not isinstance(value, cst.Call) or len(value.args) != 2 or any(a.star for a in value.args):
        return None
    return found[0] if all(p.number(a.value) is not None for a in value.args) else None


def _starred_shape(target: cst.Tuple, value: cst.BaseExpression) -> tuple[cst.BaseExpression, int] | None:
    """`*x.size(), a, b` unpacked into plain names: the shape and how many of the names take its sizes."""
    if not isinstance(value, cst.Tuple) or not value.elements or not isinstance(value.elements[0], cst.StarredElement):
        return None
    shape = value.elements[0].value
    rest = value.elements[1:]
    count = len(target.elements) - len(rest)
    if (
        not _is_shape(shape)
        or isinstance(shape, cst.Subscript)
        or count < 1
        or any(isinstance(e, cst.StarredElement) for e in rest)
        or not all(isinstance(e.value, cst.Name) and not isinstance(e, cst.StarredElement) for e in target.elements)
    ):
        return None
    return shape, count


def _is_shape(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Attribute) and node.attr.value == "shape":
        return True
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size":
        return not node.args
    if isinstance(node, cst.Subscript):
        return _is_shape(node.value)
    return False
