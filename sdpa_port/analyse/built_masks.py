"""Find where a file binds the masks transformers' builders make, so that a port can give them eager's form.

transformers 5.x builds the attention mask for the implementation in use: eager gets an additive float mask, sdpa
booleans or None. A module that reads the mask itself (T5 adds it to its position bias before the attention) needs
eager's form whatever the implementation. The port then converts each mask right where the file builds it
(`rewrite/eager_masks.py`); this module finds those places, or says why one cannot be converted.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.mask_values import BIDIRECTIONAL_BUILDER, CAUSAL_BUILDER

# the other builders of transformers' masking_utils: their None under sdpa means other things (a window, chunks)
OTHER_BUILDERS = (
    "create_sliding_window_causal_mask",
    "create_chunked_causal_mask",
    "create_masks_for_generate",
    "create_bidirectional_sliding_window_mask",
)
# positions of the arguments read, in every 5.x builder: `(config, inputs_embeds, attention_mask, ...)`
CONFIG, INPUTS = ("config", 0), ("inputs_embeds", 1)


@dataclass(frozen=True)
class BuiltMask:
    """One `target = create_causal_mask(...)` (or bidirectional) statement of the file."""

    line: int
    target: str  # the name bound
    causal: bool
    inputs: str  # the code of the `inputs_embeds` argument: the mask's dtype, batch and query length
    config: str  # the code of the `config` argument
    owner: str | None  # the top-level class whose code builds it


@dataclass(frozen=True)
class BuiltMasks:
    found: tuple[BuiltMask, ...]
    # builder calls that cannot be converted: (line, why, the top-level class whose code makes the call)
    unconvertible: tuple[tuple[int, str, str | None], ...]

    def of(self, owners: set[str]) -> "BuiltMasks":
        """The builders in the code of these classes only."""
        return BuiltMasks(
            tuple(b for b in self.found if b.owner in owners), tuple(u for u in self.unconvertible if u[2] in owners)
        )


def built_masks(module: cst.Module) -> BuiltMasks:
    """Every mask builder call of the file: the plain bindings a port can convert, and the others with why not."""
    finder = _Finder()
    cst.metadata.MetadataWrapper(module, unsafe_skip_copy=True).visit(finder)
    return BuiltMasks(tuple(finder.found), tuple(finder.unconvertible))


def _builder_name(call: cst.Call) -> str | None:
    func = call.func
    name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
    return name if name in (CAUSAL_BUILDER, BIDIRECTIONAL_BUILDER, *OTHER_BUILDERS) else None


def builder_argument(call: cst.Call, keyword: str, position: int) -> cst.BaseExpression | None:
    for index, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
        if arg.keyword is None and not arg.star and index == position:
            return arg.value
    return None


_NAMED = m.Name() | m.Attribute(value=m.Name() | m.Attribute(value=m.Name()))
# read again without effects: a name, an attribute, or a slice of one (`states[:, 0:1, :]`, Canine's)
_PURE = _NAMED | m.Subscript(value=_NAMED, slice=[m.AtLeastN(m.SubscriptElement(slice=m.Slice() | m.Index(value=m.Integer())), n=1)])


class _Finder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (cst.metadata.PositionProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.found: list[BuiltMask] = []
        self.unconvertible: list[tuple[int, str, str | None]] = []
        self._bound: set[cst.Call] = set()
        self._classes: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()

    def _unconvertible(self, line: int, why: str) -> None:
        self.unconvertible.append((line, why, self._classes[0] if self._classes else None))

    def visit_Assign(self, node: cst.Assign) -> None:
        if not isinstance(node.value, cst.Call) or _builder_name(node.value) is None:
            return
        call, line = node.value, self._line(node.value)
        self._bound.add(call)
        name = _builder_name(call)
        if name in OTHER_BUILDERS:
            self._unconvertible(line, f"`{name}` gives sdpa None for masks other than a plain causal one")
            return
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
            self._unconvertible(line, "its mask is not bound to one name")
            return
        if any(arg.star for arg in call.args):
            self._unconvertible(line, "`*args`/`**kwargs` may carry its config or inputs")
            return
        config, inputs = builder_argument(call, *CONFIG), builder_argument(call, *INPUTS)
        if config is None or inputs is None or not m.matches(config, _PURE) or not m.matches(inputs, _PURE):
            self._unconvertible(line, "its `config` and `inputs_embeds` are not plain names to read again")
            return
        target, owner = node.targets[0].target.value, self._classes[0] if self._classes else None
        self.found.append(BuiltMask(line, target, name == CAUSAL_BUILDER, code(inputs), code(config), owner))

    def visit_Call(self, node: cst.Call) -> None:
        if _builder_name(node) is not None and node not in self._bound:
            self._unconvertible(self._line(node), "its mask is not bound by an assignment of its own")

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(cst.metadata.PositionProvider, node).start.line


__all__ = ["BuiltMask", "BuiltMasks", "builder_argument", "built_masks"]
