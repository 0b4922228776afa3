"""Scales held in `self.` attributes: the statements that bind an attribute."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst

from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.module_facts import ModuleFacts

BINDINGS = '''
class A(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.plain = config.x
        self.register_buffer("buffer", torch.tensor(1.0))

    def grow(self, n):
        self.plain += n

    def unpack(self, pair):
        self.first, (self.second, *self.rest) = pair

    def loops(self, items, path):
        for self.item in items:
            pass
        with open(path) as self.handle:
            pass
        return [0 for self.comprehended in items]

    def dynamic(self, value):
        setattr(self, "set", value)

    def nested(self):
        def inner():
            self.inner = 1
        return inner
'''


def test_every_statement_that_binds_an_attribute_is_a_binding() -> None:
    """Bindings the `ast` screen must send the collector to (augmented, unpacked, targets, setattr), each with its
    method, and the value where it is a value of that method."""
    module = cst.parse_module(textwrap.dedent(BINDINGS))
    facts = ModuleFacts.of(module, ast.parse(textwrap.dedent(BINDINGS)))

    def bound(name: str) -> list[tuple[str, str | None]]:
        return [
            (b.method.name.value, None if b.value is None else code(b.value))
            for b in facts.find_attribute_bindings("A", name)
        ]

    assert bound("plain") == [("__init__", "config.x"), ("grow", "self.plain + n")]
    assert bound("buffer") == [("__init__", "torch.tensor(1.0)")]
    for name, method in [
        ("first", "unpack"),
        ("second", "unpack"),
        ("rest", "unpack"),
        ("item", "loops"),
        ("handle", "loops"),
        ("comprehended", "loops"),
        ("inner", "nested"),
    ]:
        assert bound(name) == [(method, None)], name
    assert bound("set") == [("dynamic", "value")]
