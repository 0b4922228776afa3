"""The forms of an eager attention score chain the tracer reads, one recogniser each.

The tracer (`analyse/trace.py`) keeps the environment (what each local holds), the chains' bookkeeping
(`tracer.chains`), their reads (`tracer.reads`) and the ranks of tensors (`tracer.ranks`); what an expression does
to a chain is decided here. A recogniser takes the tracer, an expression and its line, and answers

- `None`: the expression is not this form (the next one is tried);
- `(chain value, operations)`: the chain the expression continues (found through `tracer.decompose` on the
  operand) and the operations it applies, from the closed set in `chain.py`;
- or raises `Poison`: it is this form, but not one an SDPA call can express exactly, with the refusal's code.

`FORMS` is tried in order; what none of them claims is refused by the tracer (a method, a function or an operator
applied to the scores) or is not part of a chain. Adding a form: write its recogniser in the module of its kind (or
a new one), put it in `FORMS`, and give it examples in `EXAMPLES` below: forward bodies it ports, each saying in
`becomes` what its class-style port writes (the SDPA call, with the statements the form adds around it: port the
example, read the output, and write it down only once it is right for the eager code), and look-alikes it refuses
with their code (`tests/unit/test_forms.py` runs them all, and checks each port against its `becomes`). A new kind of
operation also needs its case in the exhaustive `match` statements of the planner and the emitters (mypy checks them
with `unreachable`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import libcst as cst

from sdpa_port.analyse.chain import Recognised
from sdpa_port.analyse.forms import (
    blends,
    blocks,
    dropout,
    fills,
    guards,
    products,
    scales,
    shift,
    single_query,
    softmax,
    terms,
    transposed,
    views,
    wrappers,
)
from sdpa_port.analyse.forms.common import Example

if TYPE_CHECKING:
    from sdpa_port.analyse.tracing import TracerView

@dataclass(frozen=True)
class Form:
    name: str
    recognise: Callable[["TracerView", cst.BaseExpression, int], Recognised | None]
    examples: tuple[Example, ...]


def _form(name: str, recognise: Callable[["TracerView", cst.BaseExpression, int], Recognised | None]) -> Form:
    """A form with the examples its module files under the recogniser's name."""
    module = sys.modules[recognise.__module__]
    return Form(name, recognise, module.EXAMPLES[recognise.__name__])


FORMS: tuple[Form, ...] = (
    _form("query-key product", products.query_key_product),
    _form("single-query product", single_query.single_query_product),
    _form("blocks joined", blocks.joined_blocks),
    _form("softmax", softmax.softmax),
    _form("dropout", dropout.dropout),
    _form("identity module", dropout.identity_module),
    _form("reshape", views.reshape),
    _form("regrouped permute", views.permuted),
    _form("cast", views.cast),
    _form("transposed probabilities", transposed.transposed),
    _form("masked_fill method", fills.masked_fill_method),
    _form("clamp method", guards.clamp_method),
    _form("where", fills.where),
    _form("masked_fill function", fills.masked_fill_function),
    _form("maximum", guards.maximum),
    _form("additive helper", terms.additive_helper),
    _form("softmax wrapper", wrappers.wrapper),
    _form("blend", blends.blended),
    _form("added term", terms.added),
    _form("scale", scales.scaled),
    _form("row maximum shift", shift.shifted),
)
