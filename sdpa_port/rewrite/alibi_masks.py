"""ALiBi builders that read a 2-D padding mask also take the 4-D masks continuous batching hands over.

A builder such as BLOOM's `build_alibi_tensor(attention_mask, num_heads, dtype)` unpacks
`batch_size, seq_length = attention_mask.shape` and places each key at `cumsum(mask) - 1`; a 4-D mask made it fail.
For a 4-D mask (boolean, or additive with 0 where a query attends) the same position is the number of keys the
query attends before that key, counted along its row: equal for every key the query attends (masked ones do not
count), for a padded batch and for prompts packed into one row alike. The 2-D path is left as written.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import assigned_names, block_body, code
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.patterns import walk_names
from sdpa_port.render import render_statements
from sdpa_port.rewrite.targeted import transform_named
from sdpa_port.rewrite.layout import fresh_name


@dataclass(frozen=True)
class AlibiBuilder:
    function: str
    mask: str  # the mask parameter
    dtype: str  # the dtype parameter
    slopes: cst.SimpleStatementLine  # `slopes = ...`, reading neither the batch nor the length
    slopes_name: str


@dataclass(frozen=True)
class AlibiFacts:
    builders: tuple[AlibiBuilder, ...]
    unknown: tuple[tuple[str, int], ...]  # (function, line) of 2-D-mask ALiBi builders not recognised


def alibi_builders(facts: ModuleFacts) -> AlibiFacts:
    """Module-level functions building ALiBi from a 2-D mask: recognised ones, and the others by line."""
    builders: list[AlibiBuilder] = []
    unknown: list[tuple[str, int]] = []
    for name, function in facts.functions.items():
        params = [p.name.value for p in function.params.params]
        if not params or "mask" not in params[0] or "alibi" not in name.lower():
            continue
        mask = params[0]
        body = list(block_body(function.body))
        unpacked = _two_d_unpack(body, mask)
        if unpacked is None:
            continue
        builder = _recognise(name, function, body, mask, unpacked)
        if builder is None:
            unknown.append((name, _line(facts, name)))
        else:
            builders.append(builder)
    return AlibiFacts(tuple(builders), tuple(unknown))


def _line(facts: ModuleFacts, name: str) -> int:
    if facts.tree is not None:
        for node in facts.tree.body:
            if getattr(node, "name", None) == name:
                return int(getattr(node, "lineno", 0))
    return 0


def _two_d_unpack(body: list[cst.BaseStatement], mask: str) -> set[str] | None:
    """The names of `a, b = mask.shape`, the statement that only a 2-D mask passes."""
    for statement in body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Tuple)
                and len(small.targets[0].target.elements) == 2
                and m.matches(small.value, m.Attribute(value=m.Name(mask), attr=m.Name("shape")))
            ):
                return set(assigned_names(small.targets[0].target))
    return None


def _recognise(
    name: str, function: cst.FunctionDef, body: list[cst.BaseStatement], mask: str, unpacked: set[str]
) -> AlibiBuilder | None:
    """`slopes = f(num_heads, ...)`, positions `cumsum(mask) - 1`, `return alibi.reshape(b * h, 1, n).to(dtype)`."""
    params = [p.name.value for p in function.params.params]
    dtype = next((p for p in params if p == "dtype"), None)
    text = code(function)
    if dtype is None or f"{mask}.cumsum(dim=-1)" not in text:
        return None
    slopes: cst.SimpleStatementLine | None = None
    slopes_name = ""
    for statement in body:
        if (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign)
            and len(statement.body[0].targets) == 1
            and isinstance(statement.body[0].targets[0].target, cst.Name)
            and "slope" in statement.body[0].targets[0].target.value
        ):
            slopes, slopes_name = statement, statement.body[0].targets[0].target.value
            break
    if slopes is None or walk_names(slopes) & unpacked:
        return None
    returned = [s for s in body if isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Return)]
    if len(returned) != 1:
        return None
    value = returned[0].body[0].value  # type: ignore[attr-defined]
    reshaped = m.Call(
        func=m.Attribute(
            value=m.Call(func=m.Attribute(attr=m.Name("reshape")), args=[m.DoNotCare(), m.Arg(m.Integer("1")), m.DoNotCare()]),
            attr=m.Name("to"),
        ),
        args=[m.Arg(m.Name(dtype))],
    )
    if value is None or not m.matches(value, reshaped):
        return None
    return AlibiBuilder(name, mask, dtype, slopes, slopes_name)


def accept_4d_masks(module: cst.Module, builder: AlibiBuilder) -> cst.Module:
    return transform_named(module, {builder.function}, _Prepend(builder))


class _Prepend(cst.CSTTransformer):
    def __init__(self, builder: AlibiBuilder) -> None:
        self.builder = builder

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        if updated.name.value != self.builder.function:
            return updated
        body = list(block_body(updated.body))
        taken = walk_names(updated)
        branch = render_statements(
            "interface_style/alibi_4d.py.jinja",
            mask=self.builder.mask,
            dtype=self.builder.dtype,
            attended=fresh_name("attended", taken),
            positions=fresh_name("positions", taken),
            alibi=fresh_name("alibi", taken),
            slopes=self.builder.slopes_name,
            slopes_statement=code(self.builder.slopes.with_changes(leading_lines=())).strip(),
        )
        start = 1 if body and _is_docstring(body[0]) else 0
        return updated.with_changes(body=updated.body.with_changes(body=[*body[:start], *branch, *body[start:]]))


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and m.matches(statement.body[0], m.Expr(value=m.SimpleString()))


__all__ = ["AlibiFacts", "accept_4d_masks", "alibi_builders"]
