"""Every recogniser of a chain form with its examples (`sdpa_port/analyse/forms`): what it ports, and the
look-alikes it refuses with their code. Each ported example needs its form: without it in `FORMS`, the operation
the example is there for is no longer read; and its class-style port writes what the example says it becomes."""

from __future__ import annotations

import ast
import io
import textwrap
import tokenize

import libcst as cst
import pytest

from helpers import HEADER, analyse, attention_module

from sdpa_port import PortResult, Status, Style, port_source
from sdpa_port.analyse import forms
from sdpa_port.analyse import trace as t
from sdpa_port.analyse.forms.common import EXAMPLE_INIT, GAP, Example
from sdpa_port.analyse.module_facts import ModuleFacts

CASES = [(form, example) for form in forms.FORMS for example in form.examples]
IDS = [f"{form.name}-{index}" for form in forms.FORMS for index, _ in enumerate(form.examples)]


def source_of(example: Example) -> str:
    source = attention_module(
        example.body, init=EXAMPLE_INIT + example.init, helpers=example.methods, init_params=example.init_params
    )
    if example.module:
        source = source.replace(HEADER, HEADER + "\n" + textwrap.dedent(example.module).strip() + "\n\n", 1)
    return source


# a block that builds the attention, where a class-style port selects its SDPA class
BUILDER = """

class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = Attention(config)
"""
PORTED = [(form, example) for form, example in CASES if example.refused is None]
PORTED_IDS = [i for i, (_, example) in zip(IDS, CASES) if example.refused is None]


def class_port(example: Example) -> PortResult:
    return port_source(source_of(example) + BUILDER, filename="modeling_example.py", style=Style.CLASS)


def tokens(source: str) -> str:
    """Python code as its tokens joined by single spaces, without layout, comments or a comma before a bracket."""
    kept = [
        token.string
        for token in tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline)
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT)
        and token.type != tokenize.ENDMARKER
    ]
    kept = [string for string, after in zip(kept, kept[1:] + [""]) if not (string == "," and after in ")]}")]
    return " ".join(kept)


def chain_ops(source: str) -> list[t.Op]:
    """The operations of the one attention computation the tracer finds in `Attention.forward`, [] if none."""
    module = cst.parse_module(source)
    facts = ModuleFacts.of(module, ast.parse(source))
    forward = facts.find_method("Attention", "forward")
    assert forward is not None
    result = t.Tracer(facts, "Attention", forward[1]).run()
    attention = [c for c in result.attention() if c.poison is None]
    return [op for op, _, _ in attention[0].ops] if len(attention) == 1 else []


def test_every_form_has_examples_of_both_kinds() -> None:
    for form in forms.FORMS:
        assert any(e.refused is None for e in form.examples), f"{form.name}: nothing it ports"
        assert any(e.refused is not None for e in form.examples), f"{form.name}: no look-alike it refuses"


@pytest.mark.parametrize("form,example", CASES, ids=IDS)
def test_example(form: forms.Form, example: Example) -> None:
    source = source_of(example)
    if example.refused is not None:
        # refused by the tool as a whole (a chain the recogniser gives up on is still named, F601)
        result = port_source(source, filename="modeling_example.py")
        assert result.status is Status.REFUSED, (
            f"{form.name}: {result.status.value}, expected a refusal\n{example.body}"
        )
        assert [r.code for r in result.refusals] == [example.refused], f"{form.name}: {result.reasons}\n{example.body}"
        return
    analysis = analyse(source)
    assert analysis is not None, f"{form.name}: not recognised as attention\n{example.body}"
    assert analysis.refusal is None, f"{form.name}: {analysis.refusal}\n{example.body}"
    assert example.op is not None
    assert any(isinstance(op, example.op) for op in chain_ops(source)), f"{form.name}: no {example.op.__name__}"


@pytest.mark.parametrize(
    "form,example",
    [(f, e) for f, e in CASES if e.refused is None],
    ids=[i for i, (f, e) in zip(IDS, CASES) if e.refused is None],
)
def test_example_needs_its_form(form: forms.Form, example: Example, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(t, "FORMS", tuple(f for f in forms.FORMS if f is not form))
    source = source_of(example)
    analysis = analyse(source)
    ported = analysis is not None and analysis.refusal is None
    assert example.op is not None
    assert not (ported and any(isinstance(op, example.op) for op in chain_ops(source))), (
        f"{form.name}: the example is read the same without the form\n{example.body}"
    )


def test_every_ported_example_says_what_it_becomes() -> None:
    for form, example in CASES:
        if example.refused is None:
            assert "scaled_dot_product_attention(" in example.becomes, f"{form.name}: no SDPA call\n{example.body}"
        else:
            assert not example.becomes, f"{form.name}: a refused example becomes nothing\n{example.body}"


@pytest.mark.parametrize("form,example", PORTED, ids=PORTED_IDS)
def test_example_becomes_what_it_says(form: forms.Form, example: Example) -> None:
    """The fragments of `becomes` are in the class-style port, in order, token for token."""
    result = class_port(example)
    assert result.status is Status.PORTED, f"{form.name}: {result.reasons}\n{example.body}"
    written = f" {tokens(result.source)} "
    at = 0
    for fragment in example.becomes.split(GAP):
        found = written.find(f" {tokens(fragment)} ", at)
        assert found >= 0, f"{form.name}: the port does not write (here, or after what comes before)\n{fragment}\n--- it wrote:\n{result.source}"
        at = found + len(tokens(fragment)) + 1


@pytest.mark.parametrize(
    "body,rank",
    [
        ("return query", 4),  # never assigned: what the caller passed
        ("query = query * 2\nreturn query", 4),  # its one assignment scales that value
        ("query = query.flatten(0, 1)\nreturn query", None),  # assigned otherwise
        ("if flag:\n    query = query.flatten(0, 1)\nquery = query * 2\nreturn query", None),  # on one path only
        ("query = other\nreturn query", None),
        ("for query in other:\n    pass\nreturn query", None),  # bound otherwise than by `name = value`
        ("query, flag = other\nreturn query", None),
        ("with other as query:\n    pass\nreturn query", None),
    ],
)
def test_a_helper_parameter_has_the_rank_the_caller_passes_while_it_holds_that_value(body: str, rank: int | None) -> None:
    """A helper's `query` is as forward built it (`passed_ranks`: 4-D): through `query = query * s` too, but not once
    the helper assigns it otherwise, on any path."""
    source = "def helper(query, other, flag):\n" + textwrap.indent(body, "    ") + "\n"
    module = cst.parse_module(source)
    facts = ModuleFacts.of(module, ast.parse(source))
    function = module.body[0]
    assert isinstance(function, cst.FunctionDef)
    tracer = t.Tracer(facts, None, function, param_ranks=(("query", 4),))
    tracer.run()
    assert tracer.ranks.rank_of(cst.Name("query")) == rank


def test_a_rank_passed_to_a_helper_is_read_only_from_names_forward_assigns() -> None:
    """`built` is 4-D wherever it is bound; forward's parameter `query` is whatever the caller gave until forward
    reassigns it, which may be after the call: its assignments say nothing of the value passed; `both` is also bound
    by unpacking, which no reshape tells the rank of."""
    from sdpa_port.analyse.helpers import passed_ranks

    source = (
        "def forward(self, query):\n"
        "    built = query.view(1, 2, 3, 4)\n"
        "    both = query.view(1, 2, 3, 4)\n"
        "    if query.dim() > 4:\n"
        "        both, rest = query.unbind(0)\n"
        "    out = self.helper(query, built, both)\n"
        "    query = query.view(1, 2, 3, 4)\n"
        "    return out\n"
    )
    module = cst.parse_module(source)
    facts = ModuleFacts.of(module, ast.parse(source))
    forward = module.body[0]
    assert isinstance(forward, cst.FunctionDef)
    caller = t.Tracer(facts, None, forward)
    caller.run()
    # `both` is also bound by tuple unpacking, to a value of another rank: no rank for it
    bound: dict[str, cst.BaseExpression] = {"a": cst.Name("query"), "b": cst.Name("built"), "c": cst.Name("both")}
    assert passed_ranks(bound, caller, forward) == (("b", 4),)
