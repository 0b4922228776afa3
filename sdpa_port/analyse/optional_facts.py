"""The facts that may leave one attention SDPA can take: an optional input None, a flag off.

`without_optional` traces forward under each of `tried_facts` in turn: an optional argument None, a flag of the
module off by default, a switch of the call off, an optional module None, the request for the weights off. On the
path where such a fact does not hold, the SDPA class falls back to eager.
"""

from __future__ import annotations

from typing import Iterable

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse import trace as t
from sdpa_port.analyse.cstutil import all_assigned_names, block_body, code, nodes_of_type
from sdpa_port.analyse.known import Known, negated_comparison
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.tracing import LineOf
from sdpa_port.discover.values import WEIGHT_REQUESTS, optional_input


def without_optional(
    facts: ModuleFacts, class_name: str, forward: cst.FunctionDef, line_of: LineOf
) -> tuple[Known, t.TraceResult, t.Candidate] | None:
    """The trace of `forward` under one optional fact that leaves one attention SDPA can take.

    The fact is one optional argument (default None, tested with `is not None`) None, or one flag of the module that
    `__init__` sets to False (`self.save_attention`) false, or another of `tried_facts`.
    """
    for known in tried_facts(facts, class_name, forward):
        result = t.Tracer(facts, class_name, forward, line_of, known=known).run()
        inline = result.attention()
        if len(inline) == 1 and inline[0].poison is None:
            return known, result, inline[0]
    return None


def tried_facts(facts: ModuleFacts, class_name: str, forward: cst.FunctionDef) -> list[Known]:
    """The facts `without_optional` tries, in order.

    Each optional argument None, each flag off by default false, each switch of the call false, the request for the
    weights false alone and with each of those.
    """
    tested = {
        node.left.value
        for node in nodes_of_type(forward.body, cst.Comparison)
        if isinstance(node.left, cst.Name)
        and len(node.comparisons) == 1
        and isinstance(node.comparisons[0].operator, cst.IsNot)
        and m.matches(node.comparisons[0].comparator, m.Name("None"))
    }
    params = [*forward.params.params, *forward.params.kwonly_params]
    # not the inputs every call passes (masks, caches, key/value states): falling back whenever they are given
    # would leave SDPA unused
    trials = [
        Known(none=frozenset({param.name.value}))
        for param in params
        if param.name.value in tested
        and param.default is not None
        and m.matches(param.default, m.Name("None"))
        and optional_input(param.name.value)  # head masks return to eager
    ]
    trials += [Known(falsy=frozenset({flag})) for flag in _flags_off_by_default(facts, class_name, forward)]
    # a switch of the call itself, off by default, whose branch only eager takes (fairseq's `before_softmax`, which
    # returns the scores): the SDPA class falls back when it is set
    switched = {test.test.value for test in nodes_of_type(forward.body, cst.If) if isinstance(test.test, cst.Name)}
    switches = frozenset(
        param.name.value
        for param in params
        if param.name.value in switched
        and param.name.value not in WEIGHT_REQUESTS  # tried below, with each other fact
        and param.default is not None
        and m.matches(param.default, m.Name("False"))
    )
    trials += [Known(falsy=frozenset({name})) for name in sorted(switches)]
    optional = _optional_modules(facts, class_name, forward)
    trials += [Known(none=frozenset({name})) for name in optional]
    if len(optional) > 1:
        trials.append(Known(none=frozenset(optional)))  # DeBERTa's talking heads: one projection on each side
    trials = trials[:MAX_OPTIONAL_TRIED]
    request = weights_request(param.name.value for param in params)
    if request is not None:
        # asked for weights, the SDPA class returns to eager: a step only that request takes (ProphetNet returns the
        # scores before the softmax) is off on the SDPA path, alone or with one of the other facts
        weights = frozenset({request})
        trials += [Known(falsy=weights)] + [Known(falsy=k.falsy | weights, none=k.none) for k in trials]
        if len(switches) > 1:
            # fairseq's `need_head_weights` turns `need_weights` on: every switch off with the request
            trials.append(Known(falsy=switches | weights))
    devices = frozenset(device_tests(forward))
    if devices:
        # off an XLA device, alone and with each of the others (fairseq's TPU branch beside `before_softmax`)
        trials += [Known(falsy=devices)] + [Known(falsy=k.falsy | devices, none=k.none) for k in trials]
    return trials


_DEVICE_TYPE = m.Attribute(value=m.Attribute(value=m.Name(), attr=m.Name("device")), attr=m.Name("type"))
_XLA = m.SimpleString('"xla"') | m.SimpleString("'xla'")
_DEVICE_TEST = m.Comparison(left=_DEVICE_TYPE, comparisons=[m.ComparisonTarget(m.Equal() | m.NotEqual(), _XLA)])


def device_tests(forward: cst.FunctionDef) -> list[str]:
    """The tests of an input's device that forward makes, as written: `query.device.type == "xla"` (`!=` negated).

    A branch taken only on a TPU (fairseq's transposed fill for XLA) is eager's alone: the SDPA path holds where the
    input is on another device, and the SDPA class falls back to eager on an XLA device. The input is a parameter
    every call gives (no default, never tested against None) and forward never rebinds, so the test reads the same
    tensor's device wherever it is made.
    """
    # an input every call gives: the fallback reads its device before anything else, where eager may test an optional
    # one only once it is given (`if mask is not None: if mask.device.type != "xla": ...`)
    params = {
        param.name.value for param in (*forward.params.params, *forward.params.kwonly_params) if param.default is None
    }
    params -= {
        code(node.left)
        for node in nodes_of_type(forward.body, cst.Comparison)
        if m.matches(node.comparisons[0].comparator, m.Name("None"))
    }
    rebound = all_assigned_names(block_body(forward.body))
    out: list[str] = []
    for node in nodes_of_type(forward.body, cst.Comparison):
        if not m.matches(node, _DEVICE_TEST):
            continue
        root = node.left.value.value  # type: ignore[attr-defined]
        # the test as it holds on XLA: `!=` read as its negation, as `known.decide` reads it
        on_xla = node if isinstance(node.comparisons[0].operator, cst.Equal) else negated_comparison(node)
        assert on_xla is not None
        test = code(on_xla)
        if root.value in params and root.value not in rebound and test not in out:
            out.append(test)
    return out


def is_device_test(test: str) -> bool:
    """`test` (written out, as in `Known.falsy`) is one `device_tests` gives."""
    return m.matches(cst.parse_expression(test), _DEVICE_TEST)


def _flags_off_by_default(facts: ModuleFacts, class_name: str, forward: cst.FunctionDef) -> list[str]:
    """The `self.x` attributes forward tests that the class first sets off.

    The class's first assignment sets them to a literal False (a switch like BLIP-2's `save_attention`, turned on by a
    method) or to a config setting defaulting to False (`getattr(config, "talking_head", False)`).
    """
    tested = {
        code(node)
        for test in nodes_of_type(forward.body, cst.If)
        for node in nodes_of_type(test.test, cst.Attribute)
        if m.matches(node, m.Attribute(value=m.Name("self")))
    }
    out = []
    for name in sorted(tested):
        values = facts.find_attribute_values(class_name, name.removeprefix("self."))
        if values and (m.matches(values[0], m.Name("False")) or _config_flag_off_by_default(values[0])):
            out.append(name)
    return out


def _config_flag_off_by_default(value: cst.BaseExpression) -> bool:
    """A setting off unless the config turns it on: `getattr(config, "talking_head", False)`."""
    return m.matches(
        value,
        m.Call(func=m.Name("getattr"), args=[m.Arg(m.Name("config")), m.Arg(m.SimpleString()), m.Arg(m.Name("False"))]),
    )


def _optional_modules(facts: ModuleFacts, class_name: str, forward: cst.FunctionDef) -> list[str]:
    """The `self.x` attributes forward tests with `is not None` that the class may set to None.

    A projection built only under a config flag, DeBERTa's `head_logits_proj`: the SDPA class may fall back to eager
    whenever they are set.
    """
    tested = {
        code(node.left)
        for node in nodes_of_type(forward.body, cst.Comparison)
        if m.matches(node.left, m.Attribute(value=m.Name("self")))
        and len(node.comparisons) == 1
        and isinstance(node.comparisons[0].operator, cst.IsNot)
        and m.matches(node.comparisons[0].comparator, m.Name("None"))
    }
    out = []
    for name in sorted(tested):
        values = facts.find_attribute_values(class_name, name.removeprefix("self."))
        arms = [arm for value in values for arm in ((value.body, value.orelse) if isinstance(value, cst.IfExp) else (value,))]
        if any(m.matches(arm, m.Name("None")) for arm in arms):
            out.append(name)
    return out


MAX_OPTIONAL_TRIED = 6


def weights_request(names: Iterable[str]) -> str | None:
    """The parameter among `names` by which a call asks for the attention weights, if any."""
    present = set(names)
    return next((name for name in WEIGHT_REQUESTS if name in present), None)
