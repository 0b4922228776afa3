"""Dropout of the probabilities, functional or a module; applied to the scores it is refused S112.

`self.dropout(probs)`, `nn.functional.dropout(probs, p=..., training=...)`, and a module of the file that hands its
input back unless its own settings say otherwise (DeBERTa's StableDropout: the SDPA class then runs eager whenever
those settings hold).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.analyse.chain import PROBS, Dropout, Softmax
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.forms.common import GAP, Example, scored, sdpa
from sdpa_port.analyse.wrappers import identity_unless
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def dropout(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    found = p.dropout_call(node, tracer.scope)
    if found is None or not tracer.reads.chain_refs(found.operand):
        return None
    base, ops = tracer.decompose(found.operand, line)
    tracer.require(base, ops, PROBS, "dropout", line, Code.DROPOUT)
    guard = tracer.module_guard(found.module)
    if guard is None:
        # `if self.training:` or a setting around it: SDPA's rate is the call's where the test holds too
        guard = tracer.setting_guard()
        if guard is not None:
            found = p.guarded_dropout(found, guard)
    return base, [*ops, Dropout(found, guard)]


def identity_module(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    """A module of the file that is the identity unless its settings say otherwise: no operation, and a fallback."""
    identity = identity_unless(node, tracer.facts, tracer.class_name) if isinstance(node, cst.Call) else None
    if identity is None or not tracer.reads.chain_refs(identity[0]):
        return None
    base, ops = tracer.decompose(identity[0], line)
    tracer.require(base, ops, PROBS, "dropout", line, Code.DROPOUT)
    tracer.fallbacks.append(code(identity[1]))
    return base, ops


_GUARDED = "probs = scores.softmax(-1)\nif {test}:\n    probs = self.dropout(probs)"

_MAYBE_DROP = """
class MaybeDrop(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if self.training and self.p > 0:
            return nn.functional.dropout(x, self.p)
        return x
"""

EXAMPLES = {
    "dropout": (
        Example(
            scored("probs = self.dropout(scores.softmax(-1))"),
            Dropout,
            becomes=sdpa("dropout_p=self.dropout.p if self.training else 0.0", "scale=1.0"),
        ),
        Example(
            scored("probs = nn.functional.dropout(scores.softmax(-1), p=self.p, training=self.training)"),
            Dropout,
            becomes=sdpa("dropout_p=self.p if self.training else 0.0", "scale=1.0"),
        ),
        Example(scored("probs = self.dropout(scores).softmax(-1)"), refused=Code.DROPOUT),
        # under a test of the module's settings alone: the test joins the rate's condition
        Example(
            scored(_GUARDED.format(test="self.training and self.use_dropout")),
            Dropout,
            becomes=sdpa("dropout_p=self.dropout.p if self.training and self.use_dropout else 0.0", "scale=1.0"),
        ),
        # under a test of anything else, SDPA's rate cannot follow it
        Example(scored(_GUARDED.format(test="output_attentions")), refused=Code.DROPOUT),
    ),
    # the identity unless training with p > 0: no operation (the SDPA class runs eager whenever that holds)
    "identity_module": (
        Example(
            scored("probs = self.drop(scores.softmax(-1))"),
            Softmax,
            init="self.drop = MaybeDrop(0.1)",
            module=_MAYBE_DROP,
            becomes=f"if output_attentions or self.drop.training and self.drop.p > 0:{GAP}" + sdpa("scale=1.0"),
        ),
        Example(
            scored("probs = self.drop(scores).softmax(-1)"),
            refused=Code.DROPOUT,
            init="self.drop = MaybeDrop(0.1)",
            module=_MAYBE_DROP,
        ),
    ),
}
