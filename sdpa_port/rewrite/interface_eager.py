"""The eager function of the interface style: the chain statements as written, with adapters and its return."""

from __future__ import annotations

from typing import Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import assigned_names, assignment, block_body, code, primary
from sdpa_port.analyse.patterns import inverse, permuted, then, walk_names
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.edit import replace_names, replace_nodes
from sdpa_port.rewrite.interface_options import (
    BUILTINS,
    HANDED_OVER,
    IN_PLACE,
    RESERVED,
    EagerPart,
    InterfaceOptions,
    parameter_name,
)
from sdpa_port.rewrite.sdpa_body import whole_chain_branch
from sdpa_port.rewrite.walk import StatementWalker


class _Filter(StatementWalker):
    """Keep the chain statements (and the statements moved with them) in their control-flow skeleton."""

    def __init__(self, path: SdpaPath, moved: frozenset[cst.CSTNode]) -> None:
        self.plans = path.plans
        self.dropped_ifs = path.dropped_ifs
        self.moved = moved
        self.others = path.other_streams  # the eager function computes the first stream alone
        self.output: t.OutputStmt | None = None
        self.output_small: cst.BaseSmallStatement | None = None

    def line(self, statement: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        kept: list[cst.BaseSmallStatement] = []
        for small in statement.body:
            plan = self.plans.get(small)
            if small in self.others:
                continue
            if isinstance(plan, t.ChainStmt) and plan.discarded:
                continue  # `scores.masked_fill(...)`, its result thrown away: no step, in no stream
            if isinstance(plan, t.ChainStmt) or small in self.moved:
                kept.append(small)
            elif isinstance(plan, t.OutputStmt):
                self.output, self.output_small = plan, small
                kept.append(small)
        return [statement.with_changes(body=kept)] if kept else []

    def if_statement(self, node: cst.If) -> list[cst.BaseStatement]:
        if node in self.moved:
            return [node]
        if node in self.dropped_ifs:
            return []
        branch = whole_chain_branch(node, self.plans)
        if branch is not None:
            return self.block(block_body(branch.body))  # the branch that computes the attention, alone
        return super().if_statement(node)

    def compound(self, statement: cst.With | cst.For | cst.While) -> list[cst.BaseStatement]:
        # the chain never runs in a loop (the tracer refuses that): only a `with` can hold chain statements
        return super().compound(statement) if isinstance(statement, cst.With) else []

    def other(self, statement: cst.BaseStatement) -> list[cst.BaseStatement]:
        return []


def _handed_operands(path: SdpaPath) -> dict[cst.CSTNode, cst.CSTNode]:
    """Where each branch computes its own product (`Tracer.alternatives`), the dispatch in a branch hands over that
    branch's operands: a product reading plain names reads the `query` and `key` handed over instead (the names
    themselves may differ in the other branches). A product of operands built (joined blocks) or permuted reads its
    names as written, passed on from forward."""
    mapping: dict[cst.CSTNode, cst.CSTNode] = {}
    for op in path.chain_ops:
        if isinstance(op, t.Start) and not op.joined and op.orders == (None, None) and op.operands is None:
            if isinstance(op.query, cst.Name) and isinstance(op.key, cst.Name):
                mapping[op.query] = cst.Name("__sdpa_port_query__")  # restored once the free names are read
                mapping[op.key] = cst.Name("__sdpa_port_key__")
    return mapping


def _refuse_shared(start: t.Start, output: t.Output) -> None:
    """A key or value shared by every head (a multi-query einsum's) has no heads axis to hand over."""
    if start.single:
        raise Refuse(
            Code.LAYOUT,
            "the einsum's query has no length axis (one query per head); the attention interface's functions take "
            "(batch, heads, length, dim)",
        )
    if start.heads is not None or output.shared:
        raise Refuse(
            Code.LAYOUT,
            "the einsum's key or value has no heads axis (one shared by every head); the attention interface's "
            "functions take them (batch, heads, length, dim)",
        )


def eager_body(path: SdpaPath, options: InterfaceOptions) -> tuple[list[cst.BaseStatement], EagerPart]:
    """The eager function's statements: operand adapters, the chain as written (self -> module), the return."""
    function = path.function
    fil = _Filter(path, options.moved)
    statements = fil.block(block_body(function.body))
    if fil.output is None or fil.output_small is None:
        raise Refuse(Code.NOT_EXTRACTABLE, "the product with V was not found on the eager path")
    start = path.start
    assert start is not None
    output = fil.output.output
    _refuse_shared(start, output)
    part = EagerPart()
    # the output statement keeps only the product: `attn_output = <probs @ value>`
    part.output_name = "attn_output"
    # the output statement, with any statements moved after it (a check of the output's size) kept in order
    index = next(
        (i for i, s in enumerate(statements) if isinstance(s, cst.SimpleStatementLine) and fil.output_small in s.body),
        len(statements) - 1,
    )
    replaced = _replace_output(statements[index], fil.output_small, output.node, part.output_name)
    statements = statements[:index] + replaced + statements[index + 1 :]
    # adapters: the interface hands over 4-D query, key, value and the attention mask
    flatten = {"query": start.rank == 3, "key": start.rank == 3, "value": output.rank == 3}
    adapters: list[cst.BaseStatement] = []
    provided: set[str] = {"module"}
    if output.value_left:
        # the eager function hands its value back through the product's right operand, which holds the probabilities
        raise Refuse(
            Code.LAYOUT,
            "the value multiplies the transposed probabilities from the left; the attention interface's eager function "
            "takes them the other way round",
        )
    written = (*(start.operands or (start.query, start.key)), output.product.right)
    orders = (*start.orders, output.value_order)
    operands = (start.query, start.key, output.value)
    restore: dict[str, cst.BaseExpression] = {}  # placeholders of operands written as expressions
    alternatives = path.branched
    if alternatives:
        statements = [replace_nodes(s, _handed_operands(path)) for s in statements]
        for parameter in ("query", "key"):
            restore[f"__sdpa_port_{parameter}__"] = cst.Name(parameter)
            provided.add(f"__sdpa_port_{parameter}__")
    for operand, source, order, parameter in zip(operands, written, orders, ("query", "key", "value")):
        if alternatives and parameter != "value":
            continue  # each branch's product reads its own operands (`_handed_operands`)
        if order is not None:
            # an einsum's operand, handed over laid out for SDPA: put back in the einsum's own order (flattened
            # first where the einsum reads (batch * heads, length, dim) in some order)
            given: cst.BaseExpression = cst.Name(parameter)
            if flatten[parameter]:
                given = cst.parse_expression(f"{parameter}.flatten(0, 1)")
            restored = permuted(given, inverse(order))
            if not isinstance(source, cst.Name):
                placeholder = f"__sdpa_port_{parameter}__"
                statements = [replace_nodes(s, {source: cst.Name(placeholder)}) for s in statements]
                restore[placeholder] = restored
                provided.add(placeholder)
                continue
            adapters.append(assignment(source.value, restored))
            provided.add(source.value)
        elif isinstance(operand, cst.Name):
            if operand.value != parameter or flatten[parameter]:
                flat = f"{parameter}.flatten(0, 1)" if flatten[parameter] else parameter
                adapters.append(assignment(operand.value, cst.parse_expression(flat)))
            provided.add(operand.value)
    if options.mask_param and not options.mask_by_keyword:
        if options.mask_param != "attention_mask":
            adapters.append(cst.parse_statement(f"{options.mask_param} = attention_mask"))
        provided.add(options.mask_param)
    body = [replace_names(s, {"self": cst.Name("module")}) for s in statements]
    # every other value the chain reads comes from forward, renamed where the signature already uses the name
    part.free = [n for n in free_names(body, options.module_names, reserved=frozenset()) if n not in provided]
    renames = {name: cst.Name(parameter_name(name)) for name in part.free if name in RESERVED}
    if renames:
        body = [replace_names(s, renames) for s in body]
    body = [*adapters, *(replace_names(s, restore) for s in body)]
    returned = _returned_weights(path, output)
    result_node = _handed_back(path, output, part.output_name)
    body.append(cst.parse_statement(f"return {code(primary(result_node))}.contiguous(), {returned}"))
    return body, part


def _returned_weights(path: SdpaPath, output: t.Output) -> str:
    """The name of the weights the eager function returns beside its output, or `None`."""
    weights = sorted(path.probs_after_output)
    returned = weights[0] if weights else "None"
    if weights and path.other_streams:
        # the weights forward returns may belong to another stream: the eager function returns its own stream's,
        # the probabilities its product takes (each stream's are made the same way), where forward returns those
        products = [plan for plan in path.plans.values() if isinstance(plan, t.OutputStmt)]
        probabilities = output.product.left
        if not isinstance(probabilities, cst.Name) or any(
            not any(name in plan.holders for plan in products) for name in weights
        ):
            raise Refuse(
                Code.NOT_EXTRACTABLE,
                "the weights returned are not the probabilities a product with V takes, and with several products "
                "the eager function cannot say which stream's to return",
            )
        returned = probabilities.value
    return returned


def _handed_back(path: SdpaPath, output: t.Output, name: str) -> cst.BaseExpression:
    """The eager output `name` in the (batch, query, heads, dim) layout the attention interface hands back."""
    if output.rank == 3:
        heads = _heads_in_eager(path)
        if heads is None:
            raise Refuse(Code.LAYOUT, "the flat (batch * heads) layout cannot be split back into heads")
        # an einsum's flat layout (`...->qbd`) to (batch * heads, query, dim), split into heads, handed back
        unordered = permuted(cst.Name(name), inverse(output.order) if output.order else None)
        split = cst.parse_expression(f"{code(primary(unordered))}.unflatten(0, ({heads}))")
        result_node = permuted(split, HANDED_OVER)
    else:
        # the product's layout (SDPA's, or an einsum's `...->bind`) to the (batch, query, heads, dim) handed back
        handed = then(inverse(output.order or IN_PLACE), HANDED_OVER)
        result_node = permuted(cst.Name(name), handed)
    return result_node


def _heads_in_eager(path: SdpaPath) -> str | None:
    for op in path.chain_ops:
        if isinstance(op, t.View) and op.heads is not None:
            if (walk_names(op.heads[0]) | walk_names(op.heads[1])) & path.names_assigned_after_start:
                return None  # read at the end they would hold something else
            module = {"self": cst.Name("module")}
            return f"{code(replace_names(op.heads[0], module))}, {code(replace_names(op.heads[1], module))}"
    return None


def _replace_output(
    statement: cst.BaseStatement, small: cst.BaseSmallStatement, product: cst.BaseExpression, name: str
) -> list[cst.BaseStatement]:
    assign = cst.parse_statement(f"{name} = __product__")
    assert isinstance(assign, cst.SimpleStatementLine)
    new_small = assign.body[0].with_changes(value=product)
    if isinstance(statement, cst.SimpleStatementLine):
        return [statement.with_changes(body=[new_small if s is small else s for s in statement.body])]
    raise Refuse(Code.NOT_EXTRACTABLE, "the product with V sits inside a compound statement")


def free_names(
    statements: Sequence[cst.BaseStatement], module_names: frozenset[str], reserved: frozenset[str] = RESERVED
) -> list[str]:
    """Names read before being assigned, in order of first use; module-level names and builtins excluded."""
    assigned: set[str] = set()
    free: list[str] = []
    for statement in statements:
        reads_then_writes = reads_and_writes(statement)
        for name, is_write in reads_then_writes:
            if is_write:
                assigned.add(name)
            elif name not in assigned and name not in free and name not in module_names and name not in BUILTINS:
                if name not in reserved:
                    free.append(name)
    return free


def reads_and_writes(statement: cst.CSTNode) -> list[tuple[str, bool]]:
    """Names in evaluation order for simple statements: the value's reads come before the targets' writes."""
    out: list[tuple[str, bool]] = []
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, cst.Assign):
                out.extend((n, False) for n in sorted(walk_names(small.value)))
                for target in small.targets:
                    out.extend((n, True) for n in assigned_names(target.target))
                    out.extend((n, False) for n in sorted(walk_names(target.target) - set(assigned_names(target.target))))
            elif isinstance(small, cst.AugAssign):
                out.extend((n, False) for n in sorted(walk_names(small.value) | walk_names(small.target)))
                out.extend((n, True) for n in assigned_names(small.target))
            else:
                out.extend((n, False) for n in sorted(walk_names(small)))
        return out
    if isinstance(statement, cst.If):
        out.extend((n, False) for n in sorted(walk_names(statement.test)))
        for inner in block_body(statement.body):
            out.extend(reads_and_writes(inner))
        orelse = statement.orelse
        if isinstance(orelse, cst.If):
            out.extend(reads_and_writes(orelse))
        elif isinstance(orelse, cst.Else):
            for inner in block_body(orelse.body):
                out.extend(reads_and_writes(inner))
        return out
    if isinstance(statement, cst.With):
        for item in statement.items:
            out.extend((n, False) for n in sorted(walk_names(item.item)))
        for inner in block_body(statement.body):
            out.extend(reads_and_writes(inner))
        return out
    return [(n, False) for n in sorted(walk_names(statement))]


__all__ = ["eager_body", "free_names", "reads_and_writes"]
