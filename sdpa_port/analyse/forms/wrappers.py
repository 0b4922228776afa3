"""A softmax wrapper of the file called on the scores, read as the expression it computes.

A function, a method, an autograd Function's `apply`, wrappers of wrappers (`analyse/wrappers.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse.chain import Shift
from sdpa_port.analyse.forms.common import Example, scored, sdpa
from sdpa_port.analyse.wrappers import inlined
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.chain import Recognised
    from sdpa_port.analyse.tracing import TracerView


def wrapper(tracer: TracerView, node: cst.BaseExpression, line: int) -> Recognised | None:
    if not isinstance(node, cst.Call) or not tracer.reads.chain_value_refs(node):
        return None
    expression = inlined(node, tracer.facts, tracer.scope.class_name, tracer.scope.qualify)
    return None if expression is None else tracer.decompose(expression, line)


_STABLE = """
def stable_softmax(x, dim):
    shifted = x - x.amax(dim, keepdim=True)
    return shifted.softmax(dim)
"""

_STABLE_INLINE = """
def stable_softmax(x, dim):
    return (x - x.amax(dim, keepdim=True)).softmax(dim)
"""

_LOGGED = """
def logged_softmax(x, dim):
    print(x.shape)
    return x.softmax(dim)
"""

EXAMPLES = {
    "wrapper": (
        Example(scored("probs = stable_softmax(scores, -1)"), Shift, module=_STABLE, becomes=sdpa("scale=1.0")),
        # a method of an operation
        Example(
            scored("probs = stable_softmax(scores, -1)"), Shift, module=_STABLE_INLINE, becomes=sdpa("scale=1.0")
        ),
        Example(
            scored("probs = logged_softmax(scores, -1)"), refused=Code.UNRECOGNISED, module=_LOGGED
        ),  # not a straight line
    ),
}
