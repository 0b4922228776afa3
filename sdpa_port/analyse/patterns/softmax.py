"""Recognise a softmax call in each of the forms eager attention writes it."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from sdpa_port.analyse.patterns.calls import Scope, arg, method_call, self_attribute_name
from sdpa_port.analyse.patterns.functions import SOFTMAX_FUNCTIONS, SOFTMAX_MODULES


class SoftmaxForm(enum.Enum):
    FUNCTIONAL = "functional"  # nn.functional.softmax(x, dim), torch.softmax(x, dim)
    METHOD = "method"  # x.softmax(dim)
    MODULE = "module"  # nn.Softmax(dim)(x)
    MODULE_ATTRIBUTE = "module_attribute"  # self.softmax(x) with self.softmax = nn.Softmax(dim)


@dataclass(frozen=True)
class SoftmaxCall:
    operand: cst.BaseExpression
    form: SoftmaxForm
    dim: cst.BaseExpression | None
    upcast: bool


def softmax_call(node: cst.BaseExpression, scope: Scope) -> SoftmaxCall | None:
    if not isinstance(node, cst.Call):
        return None
    qualified = scope.qualify(node.func)
    if qualified in SOFTMAX_FUNCTIONS:
        operand = arg(node, 0, "input")
        if operand is None:
            return None
        return SoftmaxCall(operand, SoftmaxForm.FUNCTIONAL, arg(node, 1, "dim"), arg(node, 2, "dtype") is not None)
    func = node.func
    attribute = self_attribute_name(func)
    if attribute is not None:
        value = scope.self_attribute(attribute)
        if isinstance(value, cst.Call) and scope.qualify(value.func) in SOFTMAX_MODULES and len(node.args) == 1:
            return SoftmaxCall(node.args[0].value, SoftmaxForm.MODULE_ATTRIBUTE, arg(value, 0, "dim"), False)
        return None
    receiver = method_call(node, {"softmax"})
    # `utils.softmax(x, dim=-1)` after `from fairseq import utils`: a function of an imported module, no method
    imported = qualified is not None and qualified != get_full_name_for_node(func)
    if receiver is not None and not imported:
        return SoftmaxCall(receiver[0], SoftmaxForm.METHOD, arg(node, 0, "dim"), arg(node, 1, "dtype") is not None)
    if isinstance(func, cst.Call) and scope.qualify(func.func) in SOFTMAX_MODULES and len(node.args) == 1:
        return SoftmaxCall(node.args[0].value, SoftmaxForm.MODULE, arg(func, 0, "dim"), False)
    return None
