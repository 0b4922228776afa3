"""Recognise a batched product of two tensors: matmul, bmm, `@`, einsum or baddbmm."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import libcst as cst

from sdpa_port.analyse.patterns.calls import Scope, arg, has_star_args, method_call
from sdpa_port.analyse.patterns.einsum import einsum_spec
from sdpa_port.analyse.patterns.functions import BADDBMM_FUNCTIONS, EINSUM_FUNCTIONS, MATMUL_FUNCTIONS


class ProductForm(enum.Enum):
    MATMUL = "matmul"  # torch.matmul(a, b), a.matmul(b)
    BMM = "bmm"  # torch.bmm(a, b), a.bmm(b)
    OPERATOR = "operator"  # a @ b
    EINSUM = "einsum"  # torch.einsum(spec, a, b)
    BADDBMM = "baddbmm"  # torch.baddbmm(input, a, b, beta=, alpha=)


@dataclass(frozen=True)
class Product:
    """A batched product of two tensors: the scores, or the output.

    Scores have left=query, right=key^T; the output left=probs, right=value.
    """

    form: ProductForm
    left: cst.BaseExpression
    right: cst.BaseExpression
    rank: int | None  # 3 for bmm/baddbmm, from the einsum spec, None for matmul
    alpha: cst.BaseExpression | None = None
    beta: cst.BaseExpression | None = None
    initial: cst.BaseExpression | None = None  # baddbmm's input
    spec: str | None = None


def product(node: cst.BaseExpression, scope: Scope) -> Product | None:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return Product(ProductForm.OPERATOR, node.left, node.right, None)
    if not isinstance(node, cst.Call) or has_star_args(node):
        return None
    qualified = scope.qualify(node.func)
    if qualified in MATMUL_FUNCTIONS:
        left, right = arg(node, 0, "input"), arg(node, 1, "mat2" if qualified == "torch.bmm" else "other")
        if left is None or right is None:
            return None
        bmm = qualified == "torch.bmm"
        return Product(ProductForm.BMM if bmm else ProductForm.MATMUL, left, right, 3 if bmm else None)
    receiver = method_call(node, {"matmul", "bmm"})
    if receiver is not None and len(node.args) == 1:
        form = ProductForm(receiver[1])
        return Product(form, receiver[0], node.args[0].value, 3 if form is ProductForm.BMM else None)
    if qualified in EINSUM_FUNCTIONS:
        spec = einsum_spec(node)
        operands = _einsum_operands(node)
        if spec is None or operands is None:
            return None
        return Product(ProductForm.EINSUM, operands[0], operands[1], None, spec=spec)
    if qualified in BADDBMM_FUNCTIONS or method_call(node, {"baddbmm"}) is not None:
        if qualified in BADDBMM_FUNCTIONS:
            initial = arg(node, 0, "input")
            left, right = arg(node, 1, "batch1"), arg(node, 2, "batch2")
        else:
            initial = node.func.value  # type: ignore[attr-defined]
            left, right = arg(node, 0, "batch1"), arg(node, 1, "batch2")
        if left is None or right is None or initial is None:
            return None
        beta = _keyword(node, "beta")
        alpha = _keyword(node, "alpha")
        return Product(ProductForm.BADDBMM, left, right, 3, alpha=alpha, beta=beta, initial=initial)
    return None


def _einsum_operands(call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """The two operands of `einsum(spec, a, b)` or of `einsum(spec, [a, b])`.

    A list or tuple of exactly two.
    """
    if any(a.keyword is not None for a in call.args):
        return None
    if len(call.args) == 3:
        return call.args[1].value, call.args[2].value
    if len(call.args) == 2 and isinstance(call.args[1].value, (cst.List, cst.Tuple)):
        elements = call.args[1].value.elements
        if len(elements) == 2 and all(isinstance(e, cst.Element) for e in elements):
            return elements[0].value, elements[1].value
    return None


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a.value
    return None
