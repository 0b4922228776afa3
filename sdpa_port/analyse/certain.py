"""Branch tests the file decides for certain, read for the recogniser: a side such a test rules out cannot run.

The facts are the live branch's (`discover/live.py`, read by `discover/values.py`): literals (`if False:`), module
names assigned once to a literal and bound nowhere else (`USE_FUSED = False`), and `self.<attr>` where `<attr>` is
assigned once in the whole file, to a literal, in the `__init__` of the class or of an in-file base
(`self.scale_mask_softmax = None`). `self` is the instance of the class being analysed: in its methods, and in a
module-level function handed the module (`attention_fn(self, ...)`, read as a method). An attribute assigned twice,
in another method, in a subclass, or to anything but a literal, and a module name bound again, decide nothing.

Before (the fused branch can never run: `self.fused_softmax` is None in every instance):

    if self.fused_softmax:
        probs = self.fused_softmax(scores, mask)
    else:
        probs = (scores + mask).softmax(dim=-1)

The recogniser follows the `else` alone, and the SDPA side runs it alone (`rewrite/specialise.py` folds the test).
An attribute may still be set from outside the file (`model.layer.attention.save_attention = True`, a hook other
code turns on): a test reading `self.` is decided only for a class that does not port without it, only in a simple
form (`self.x`, `not self.x`, `self.x is None`, `self.x == 1` and their negations), and the port then falls back to
eager where it does not hold, as for any setting only eager takes (`ClassAnalysis.eager_only_flags`):
`if output_attentions or self.scale_mask_softmax:`.
"""

from __future__ import annotations

import ast
from typing import Callable

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import code, nodes_of_type, walk_names
from sdpa_port.analyse.known import negation
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.discover.bindings import Bindings
from sdpa_port.discover.values import Evaluator, Scope

_KEY = "certain"


class Certain:
    """The certain value of branch tests in one file, each read in the class whose `self` it reads."""

    def __init__(self, evaluator: Evaluator | None, module: cst.Module) -> None:
        self.evaluator = evaluator
        self.module = module
        self.decided: dict[tuple[str | None, str], bool | None] = {}
        # the classes whose analysis reads tests of the module's attributes too (`recognise.analyse_class`, where
        # the class does not port without): the port then falls back to eager where they do not hold
        self.attributes: set[str] = set()

    def decide(self, test: cst.BaseExpression, class_name: str | None) -> bool | None:
        """True or False where the test has that value whenever it runs; None where that is not certain, or where
        the test reads `self.` while the class reads no attributes, or in other than a simple form (`fallback` could
        not name it)."""
        if self.evaluator is None:
            return None
        if reads_module(test) and not (class_name in self.attributes and _simple(test)):
            return None
        return self._decided(test, class_name)

    def decides_attributes(self, class_name: str) -> bool:
        """Some test of the file reading the module's attributes is certain in the class."""
        if self.evaluator is None:
            return False
        tests = [node.test for node in nodes_of_type(self.module, cst.If, into_scopes=True)]
        return any(reads_module(test) and _simple(test) and self._decided(test, class_name) is not None for test in tests)

    def _decided(self, test: cst.BaseExpression, class_name: str | None) -> bool | None:
        text = code(test)
        key = (class_name, text)
        if key not in self.decided:
            self.decided[key] = self._read(text, class_name)
        return self.decided[key]

    def _read(self, text: str, class_name: str | None) -> bool | None:
        assert self.evaluator is not None
        try:
            expression = ast.parse(f"({text})", mode="eval").body
        except SyntaxError:
            return None
        return self.evaluator.truth(expression, Scope(class_name))


def reads_module(test: cst.BaseExpression) -> bool:
    """The test reads the module (`self`), which code outside the file may change."""
    return "self" in walk_names(test)


def fallback(test: cst.BaseExpression, decision: bool) -> str:
    """The condition under which the port falls back to eager, for a test reading the module decided `decision`: the
    test where it was found false, its negation where true (`known.decide` reads either)."""
    return code(test) if decision is False else negation(code(test))


def _simple(test: cst.BaseExpression) -> bool:
    """`self.x`, `not self.x`, or one comparison of `self.x` with a literal."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test = test.expression
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        literal = test.comparisons[0].comparator
        if not (isinstance(literal, (cst.BaseNumber, cst.BaseString)) or m.matches(literal, m.Name("None") | m.Name("True") | m.Name("False"))):
            return False
        test = test.left
    return m.matches(test, m.Attribute(value=m.Name("self"), attr=m.Name()))


def certain(facts: ModuleFacts) -> Certain:
    """The file's certain tests, read once per file (none where the file's `ast` tree is not at hand)."""
    found = facts.derived.get(_KEY)
    if not isinstance(found, Certain):
        found = Certain(None if facts.tree is None else Evaluator(Bindings.of(facts.tree)), facts.module)
        facts.derived[_KEY] = found
    return found


def certain_in(facts: ModuleFacts, class_name: str) -> Callable[[cst.BaseExpression], bool | None] | None:
    """How `specialise` reads tests in a class's methods: those reading no attribute of the module (the others are
    the analysis's fallbacks, known false on the SDPA side); None where the file's tree is not at hand."""
    found = certain(facts)
    if found.evaluator is None:
        return None
    return lambda test: None if reads_module(test) else found.decide(test, class_name)
