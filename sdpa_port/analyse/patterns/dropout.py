"""Recognise a dropout call, functional or a module, with its rate and when it is active."""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from sdpa_port.analyse.patterns.calls import Scope, arg, self_attribute_name
from sdpa_port.analyse.patterns.conditions import conjuncts, joined
from sdpa_port.analyse.patterns.functions import DROPOUT_FUNCTIONS, DROPOUT_MODULES


@dataclass(frozen=True)
class DropoutCall:
    operand: cst.BaseExpression
    # expression for SDPA's dropout_p when training, and the expression that says whether it is active
    probability: cst.BaseExpression
    training: cst.BaseExpression
    module: str | None = None  # the `self.` attribute holding the Dropout module, when it is one


def dropout_call(node: cst.BaseExpression, scope: Scope) -> DropoutCall | None:
    if not isinstance(node, cst.Call):
        return None
    qualified = scope.qualify(node.func)
    if qualified in DROPOUT_FUNCTIONS:
        operand = arg(node, 0, "input")
        probability = arg(node, 1, "p")
        training = arg(node, 2, "training" if qualified.endswith("functional.dropout") else "train")
        if operand is None:
            return None
        if probability is None:
            probability = cst.Float("0.5")
        if training is None:
            training = cst.Name("True")
        return DropoutCall(operand, probability, training)
    attribute = self_attribute_name(node.func)
    if attribute is None and isinstance(node.func, cst.Name):
        # a name holding `self.<attr>` (a helper's parameter every call binds to it): that attribute, called
        held = scope.local_value(node.func.value)
        attribute = self_attribute_name(held) if held is not None else None
    if attribute is not None and len(node.args) == 1:
        values = [a for v in scope.self_attribute_values(attribute) for a in _alternatives(v)]
        modules = [v for v in values if isinstance(v, cst.Call) and scope.qualify(v.func) in DROPOUT_MODULES]
        nones = [v for v in values if isinstance(v, cst.Name) and v.value == "None"]
        if modules and len(modules) + len(nones) == len(values):
            # a module `__init__` leaves None without dropout (CPM-Ant): called, it is the Dropout; its rate is 0.0
            # where it is None, which SDPA's `dropout_p` must read without calling it
            text = f"self.{attribute}.p" if not nones else f"(self.{attribute}.p if self.{attribute} is not None else 0.0)"
            probability = cst.parse_expression(text)
            return DropoutCall(node.args[0].value, probability, cst.parse_expression("self.training"), attribute)
    return None


def guarded_dropout(call: DropoutCall, guard: cst.BaseExpression) -> DropoutCall:
    """The dropout call run only where `guard` holds, as one whose `training` says when it is active.

    Its `training` is the guard and the call's own `training` (the guard alone where that is True or one of the guard's
    `and` terms).
    """
    own = call.training
    if (isinstance(own, cst.Name) and own.value == "True") or any(own.deep_equals(c) for c in conjuncts(guard)):
        training: cst.BaseExpression = guard
    else:
        training = joined([guard, own])
    return replace(call, training=training)


def _alternatives(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values a conditional expression may give.

    Both arms of `nn.Dropout(p) if p else None`.
    """
    if isinstance(node, cst.IfExp):
        return _alternatives(node.body) + _alternatives(node.orelse)
    return [node]
