"""Constructor parameters a class uses as layer sizes, read from its file with libcst, for a module built alone.

Imports no torch.

A constructor parameter that no name rule values (`alone._arguments`) may still be a width: `__init__` passes it to
a layer as a size, which the scale analysis already proves (`scalars.sized_parameters`). Before:

    def __init__(self, in_channels, key_channels, scale=1):
        self.f_key = nn.Conv2d(in_channels, key_channels, 1)    # `key_channels`: no value, the class is not built

After: `layer_sized(ObjectAttention)` is `{"in_channels", "key_channels"}`, and `key_channels` is given the module's
width, as `in_channels` is. A wrong guess only keeps the original from building or running: the port is compared
with the original on whatever they are built with.
"""

from __future__ import annotations

import inspect
import sys

import libcst as cst

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.patterns.scalars import sized_parameters
from sdpa_port.analyse.scope import FunctionScope


def layer_sized(klass: type) -> frozenset[str]:
    """The parameters of `klass.__init__` (its own, or an in-file base's) used as integer sizes of a layer, a new
    tensor or a view; empty where the class's file cannot be read or parsed."""
    module = sys.modules.get(klass.__module__)
    kept = getattr(module, "__sdpa_port_source__", None)
    try:
        source = kept if isinstance(kept, str) else inspect.getsource(module) if module is not None else None
        if source is None:
            return frozenset()
        facts = ModuleFacts.of(cst.parse_module(source))
    except (OSError, TypeError, cst.ParserSyntaxError):
        return frozenset()
    found = facts.find_method(klass.__name__, "__init__")
    if found is None:
        return frozenset()
    return sized_parameters(found[1], FunctionScope(facts, klass.__name__, {}))


__all__ = ["layer_sized"]
