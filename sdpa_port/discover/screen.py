"""A fast first look with the standard `ast` module: is there anything for libcst to do in this file?

Parsing with libcst costs about ten times more than `ast`; most files of a release either already support SDPA or
have no softmax at all, and are answered from this screen alone. Each top-level statement is walked once (see
`Uses`); every question the screen asks is then a set operation.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from sdpa_port.discover.bindings import SDPA, Bindings
from sdpa_port.discover.live import sdpa_use

SOFTMAX_NAMES = frozenset({"softmax", "Softmax", "softmax_"})
REGISTRY = "ALL_ATTENTION_FUNCTIONS"


@dataclass(frozen=True)
class Screen:
    supports_sdpa: bool
    # top-level classes that call a softmax somewhere in their body, plus their in-file subclasses
    softmax_classes: frozenset[str]
    interface_machinery: bool  # imports masking_utils or ALL_ATTENTION_FUNCTIONS
    uses_attention_interface: bool  # dispatches through ALL_ATTENTION_FUNCTIONS already
    modeling: bool = True  # imports torch or defines a module class: a modeling file at all
    # classes whose forward calls SDPA on its default path and no softmax there (`live.sdpa_use`): they already
    # support SDPA, whatever eager code they keep for the other paths, and are not among `softmax_classes`; the file
    # supports SDPA when they leave no other class with a softmax
    sdpa_classes: frozenset[str] = frozenset()
    sdpa_callers: frozenset[str] = frozenset()  # classes whose forward calls SDPA where it can run, by default or not


@dataclass(frozen=True)
class Uses:
    """What one subtree calls and names, gathered in a single walk."""

    softmax: bool  # calls `softmax`, `Softmax` or `softmax_` (as a name or an attribute)
    called: frozenset[str]  # names called directly: `name(...)`
    called_on_self: frozenset[str]  # attributes called on self: `self.name(...)`
    registry: bool  # mentions the name ALL_ATTENTION_FUNCTIONS
    # binds `self.<name>`: `self.x = ...` (also annotated, augmented, one of chained targets or unpacked), as the
    # target of a loop, a comprehension or a `with`
    assigns_self: bool = False
    applied: frozenset[str] = frozenset()  # autograd Functions applied: `Name.apply(...)`
    sdpa: bool = False  # calls a `scaled_dot_product_attention` (as a name or an attribute)


# fields that never hold a node worth visiting (expression contexts, operators, plain values)
_SKIPPED_FIELDS = frozenset({"ctx", "op", "type_comment", "kind", "id", "attr", "arg", "level", "module", "conversion"})
_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(kind: type) -> tuple[str, ...]:
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = _FIELDS[kind] = tuple(name for name in kind._fields if name not in _SKIPPED_FIELDS)  # type: ignore[attr-defined]
    return fields


def uses(node: ast.AST) -> Uses:
    """One iterative walk over `node`; about three times faster than the same questions asked with `ast.walk`."""
    softmax = registry = assigns_self = sdpa = False
    called: set[str] = set()
    applied: set[str] = set()
    on_self: set[str] = set()
    stack = [node]
    pop, push, is_node = stack.pop, stack.append, isinstance
    while stack:
        current = pop()
        kind = current.__class__
        if kind is ast.Call:
            func = current.func  # type: ignore[attr-defined]
            if func.__class__ is ast.Name:
                called.add(func.id)
            elif func.__class__ is ast.Attribute:
                softmax = softmax or func.attr in SOFTMAX_NAMES
                sdpa = sdpa or func.attr == SDPA
                if func.value.__class__ is ast.Name and func.value.id == "self":
                    on_self.add(func.attr)
                elif func.attr == "apply" and func.value.__class__ is ast.Name:
                    applied.add(func.value.id)
        elif kind is ast.Name:
            registry = registry or current.id == REGISTRY  # type: ignore[attr-defined]
            continue  # only its context below
        elif kind is ast.Assign:
            assigns_self = assigns_self or any(_binds_self(t) for t in current.targets)  # type: ignore[attr-defined]
        elif kind is ast.AnnAssign and current.value is not None:  # type: ignore[attr-defined]
            assigns_self = assigns_self or _is_self_attribute(current.target)  # type: ignore[attr-defined]
        elif kind is ast.AugAssign or kind is ast.For or kind is ast.AsyncFor or kind is ast.comprehension:
            assigns_self = assigns_self or _binds_self(current.target)  # type: ignore[attr-defined]
        elif kind is ast.withitem and current.optional_vars is not None:  # type: ignore[attr-defined]
            assigns_self = assigns_self or _binds_self(current.optional_vars)  # type: ignore[attr-defined]
        for name in _FIELDS.get(kind) or _fields(kind):
            value = getattr(current, name, None)
            if value.__class__ is list:
                for item in value:
                    if is_node(item, ast.AST):
                        push(item)
            elif is_node(value, ast.AST):
                push(value)  # type: ignore[arg-type]
    softmax = softmax or not SOFTMAX_NAMES.isdisjoint(called)
    sdpa = sdpa or SDPA in called
    return Uses(softmax, frozenset(called), frozenset(on_self), registry, assigns_self, frozenset(applied), sdpa)


def _is_self_attribute(node: ast.expr) -> bool:
    return node.__class__ is ast.Attribute and node.value.__class__ is ast.Name and node.value.id == "self"


def _binds_self(target: ast.expr) -> bool:
    """A target that is `self.<name>`, or unpacks into one."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_binds_self(element) for element in target.elts)
    if isinstance(target, ast.Starred):
        return _binds_self(target.value)
    return _is_self_attribute(target)


def screen(tree: ast.Module, bindings: Bindings | None = None) -> Screen:
    """What the file holds. `tree` is the file as it runs (`live.live_tree`); `bindings` those of the file as
    written, read here where the tree calls SDPA and not given."""
    classes: dict[str, ast.ClassDef] = {}
    class_uses: dict[str, Uses] = {}
    functions: set[str] = set()
    from_modeling: set[str] = set()  # names imported from another modeling file (modular files build on them)
    supports = interface = dispatches = imports_torch = calls_sdpa = False
    sdpa_names = {SDPA}  # and the names it is imported under
    called: set[str] = set()
    for node in tree.body:
        found = uses(node)
        dispatches = dispatches or found.registry
        calls_sdpa = calls_sdpa or found.sdpa
        called |= found.called
        if isinstance(node, ast.ClassDef):
            classes[node.name] = node
            class_uses[node.name] = found
        elif isinstance(node, ast.FunctionDef) and found.softmax:
            functions.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imports_torch = imports_torch or _imports_torch(node)
            module = getattr(node, "module", None) or ""
            names = [alias.name for alias in node.names]
            if "masking_utils" in module.split(".") or REGISTRY in names:
                interface = True
            if module.split(".")[-1].startswith(("modeling_", "modular_")):
                from_modeling.update(alias.asname or alias.name for alias in node.names)
            if module == "torch.nn.functional":
                sdpa_names.update(alias.asname or alias.name for alias in node.names if alias.name == SDPA)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(getattr(node, "value", None), ast.Dict):
            keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]  # type: ignore[union-attr]
            if "eager" in keys and "sdpa" in keys:
                supports = True
    bases = {name: _base_names(node) for name, node in classes.items()}
    for name, node in classes.items():
        if (_is_pretrained_root(node) or "PreTrainedModel" in bases[name]) and _sets_supports_sdpa(node):
            supports = True
    with_softmax = {name for name, used in class_uses.items() if used.softmax}
    # subclasses inherit forward and helpers
    changed = True
    while changed:
        changed = False
        for name in classes:
            if name not in with_softmax and bases[name] & with_softmax:
                with_softmax.add(name)
                changed = True
    # classes whose forward calls a module-level softmax function (eager_attention_forward(self, ...)), or applies
    # an autograd Function of the file that computes one (DeBERTa's `XSoftmax.apply(scores, mask, -1)`)
    if functions:
        with_softmax |= {name for name, used in class_uses.items() if used.called & functions}
    with_softmax |= {name for name, used in class_uses.items() if used.applied & with_softmax}
    modeling = imports_torch or any(
        any(base.endswith(("Module", "PreTrainedModel")) for base in names) or names & from_modeling
        for names in bases.values()
    )
    calls_sdpa = calls_sdpa or not called.isdisjoint(sdpa_names)
    if not calls_sdpa or supports:
        return Screen(supports, frozenset(with_softmax), interface, dispatches, modeling)
    # classes that compute with SDPA by default keep their eager code for other paths: nothing to port there; a file
    # dispatching through the attention interface is the interface style's to decide (its classes pass the eager
    # function as a value, and hold no softmax of their own)
    use = sdpa_use(tree, bindings or Bindings.of(tree))
    with_softmax -= use.default
    supports = bool(use.default) and not with_softmax and not dispatches
    return Screen(supports, frozenset(with_softmax), interface, dispatches, modeling, use.default, use.live)


def _sets_supports_sdpa(node: ast.ClassDef) -> bool:
    return any(
        isinstance(statement, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_supports_sdpa" for t in statement.targets)
        and isinstance(statement.value, ast.Constant)
        and statement.value.value is True
        for statement in node.body
    )


def _imports_torch(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "torch" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "torch"
    return False


def _base_names(node: ast.ClassDef) -> set[str]:
    out = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            out.add(base.id)
        elif isinstance(base, ast.Attribute):
            out.add(base.attr)
    return out


def _is_pretrained_root(node: ast.ClassDef) -> bool:
    return node.name.endswith("PreTrainedModel")
