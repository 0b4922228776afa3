"""What several recognisers of chain forms share: the shape of their examples, and casts around an operand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from sdpa_port.analyse import patterns as p
from sdpa_port.refusals import Code

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView

# what the examples' attention module sets up in `__init__` (each example may add lines)
EXAMPLE_INIT = """
self.scaling = config.head_dim ** -0.5
self.dropout = nn.Dropout(config.attention_dropout)
self.p = config.attention_dropout
self.register_buffer("bias", torch.tril(torch.ones((8, 8), dtype=torch.bool)).view(1, 1, 8, 8), persistent=False)
self.softmax = nn.Softmax(dim=-1)
self.temperature = nn.Parameter(torch.ones(8))  # one per key: not a scale
"""


@dataclass(frozen=True)
class Example:
    """A forward body a recogniser decides, with what it becomes.

    `tests/unit/test_forms.py` runs it in `Attention.forward(self, query, key, value, attention_mask=None,
    head_mask=None, output_attentions=False)` of a module whose `__init__(self, config, <init_params>)` runs
    EXAMPLE_INIT and `init`. Without
    `refused` the attention is ported and its chain holds an operation of type `op`, which it no longer does with the
    form taken out of `FORMS`; with it, the port is refused with that code.

    A ported example says in `becomes` what the class-style port writes for it (the module given a block that builds
    the attention), as Fixit's rules carry their expected replacement: the SDPA call (`sdpa(...)` below) with the
    statements around it that the form decides (the mask a fill builds, the fallback a setting adds), as fragments in
    the order the port writes them, separated by `GAP`. The test compares tokens, so line breaks, indentation,
    comments and trailing commas do not count. A refused example becomes nothing.
    """

    body: str
    op: type | None = None
    refused: Code | None = None
    becomes: str = ""
    init: str = ""
    init_params: str = ""  # `__init__`'s parameters after `config`
    methods: str = ""  # further methods of the class
    module: str = ""  # module-level code before the class


# between two fragments of what an example becomes: the port writes other code there
GAP = "\n...\n"


def sdpa(*arguments: str, operands: str = "query, key, value") -> str:
    """The SDPA call a port writes for an example, with its operands and then its keyword arguments."""
    return f"torch.nn.functional.scaled_dot_product_attention({', '.join((operands, *arguments))})"


# the port of scores from operands laid out (length, batch, heads, dim): operands permuted for SDPA, output back
SEQUENCE_FIRST = (
    "sdpa_query = query.permute(1, 2, 0, 3)\nsdpa_key = key.permute(1, 2, 0, 3)\nreturn "
    + sdpa("scale=1.0", operands="sdpa_query, sdpa_key, value.permute(1, 2, 0, 3)")
    + ".permute(2, 0, 1, 3)"
)


def scored(lines: str, before: str = "") -> str:
    """An example body: `before`, the scores, `lines`, and the product with V.

    The scores are `q @ k^T`; `lines` end with the probabilities in `probs`.
    """
    return f"{before}scores = torch.matmul(query, key.transpose(-1, -2))\n{lines}\nreturn torch.matmul(probs, value)"


def strip_casts(node: cst.BaseExpression, scope: p.Scope) -> tuple[cst.BaseExpression, bool]:
    upcast = False
    while True:
        found = p.method_call(node, p.CAST_METHODS)
        if found is None:
            return node, upcast
        receiver, name = found
        assert isinstance(node, cst.Call)
        if name in ("float", "double") or casts_to_float32(node, scope):
            upcast = True
        elif name not in ("contiguous",) and not _is_dtype_cast(node):
            return node, upcast
        node = receiver


def casts_to_float32(node: cst.Call, scope: p.Scope) -> bool:
    for a in node.args:
        if scope.qualify(a.value) in ("torch.float32", "torch.float", "torch.float64"):
            return True
    return False


def _is_dtype_cast(node: cst.Call) -> bool:
    """A cast of dtype only, no device move.

    `.to(x.dtype)`, `.to(torch.float32)`, `.type(value.dtype)`, `.type_as(t)`.
    """
    for a in node.args:
        if a.keyword is not None and a.keyword.value not in ("dtype",):
            return False
    return True


def method_on_chain(
    tracer: TracerView, node: cst.BaseExpression, names: frozenset[str] | set[str]
) -> tuple[cst.Call, cst.BaseExpression, str] | None:
    """The call, its receiver and the name of `x.name(...)` on a chain.

    `name` is in `names` and `x` holds a chain or a product that starts one.
    """
    found = p.method_call(node, names)
    if found is None or not isinstance(node, cst.Call) or not tracer.chain_or_start(found[0]):
        return None
    return node, found[0], found[1]
