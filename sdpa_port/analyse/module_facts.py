"""Read-only facts about a modeling file: its classes, their attributes and buffers, dicts and imports."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cached_property

import libcst as cst
from libcst.helpers import get_full_name_for_node

from sdpa_port.analyse.names import ImportMap
from sdpa_port.discover.screen import Uses, uses


@dataclass(frozen=True)
class Binding:
    """One statement of a method that binds `self.<name>`, and the value it gives the attribute.

    `value` is the value of `self.x = value`, `self.x op value` for `self.x op= value`, the tensor a buffer is registered
    with (`register_buffer("x", value)`, `self.x = nn.Buffer(value)` gives the call) or the value of `setattr(self,
    "x", value)`; None where the statement binds it otherwise (a tuple unpacked, a loop's or a `with`'s target) or
    sits in a function nested in `method`, whose names `method` does not see.
    """

    method: cst.FunctionDef
    value: cst.BaseExpression | None


# `self.x op= value`: the operator of `self.x op value`
_AUGMENTED: dict[type, type] = {
    cst.AddAssign: cst.Add,
    cst.SubtractAssign: cst.Subtract,
    cst.MultiplyAssign: cst.Multiply,
    cst.DivideAssign: cst.Divide,
    cst.FloorDivideAssign: cst.FloorDivide,
    cst.ModuloAssign: cst.Modulo,
    cst.PowerAssign: cst.Power,
}


class ClassInfo:
    """One top-level class: its bases, methods and (computed on demand) the `self.x = ...` assignments."""

    def __init__(self, node: cst.ClassDef, assigning: frozenset[str] | None = None) -> None:
        self.name = node.name.value
        # the methods that can assign `self.x` or register a buffer (from the ast); None: not known, visit all
        self.assigning = assigning
        self.node = node
        self.bases = tuple(get_full_name_for_node(arg.value) or "" for arg in node.bases)
        self.methods: dict[str, cst.FunctionDef] = {}
        self.class_vars: dict[str, cst.BaseExpression] = {}
        for stmt in node.body.body:
            if isinstance(stmt, cst.FunctionDef):
                self.methods[stmt.name.value] = stmt
            elif isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Assign) and len(small.targets) == 1:
                        target = small.targets[0].target
                        if isinstance(target, cst.Name):
                            self.class_vars[target.value] = small.value
                    elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value:
                        self.class_vars[small.target.value] = small.value
        self._collected: _SelfAssignments | None = None

    @classmethod
    def of(cls, node: cst.ClassDef, assigning: frozenset[str] | None = None) -> "ClassInfo":
        return cls(node, assigning)

    def _collect(self) -> "_SelfAssignments":
        if self._collected is None:
            collector = _SelfAssignments()
            for name, method in self.methods.items():
                if self.assigning is None or name in self.assigning:
                    collector.method = method
                    method.visit(collector)
            self._collected = collector
        return self._collected

    @property
    def attributes(self) -> dict[str, list[cst.BaseExpression]]:
        """attribute -> every expression assigned to `self.<attribute>` in any method, in source order"""
        return self._collect().attributes

    @property
    def buffers(self) -> dict[str, cst.BaseExpression]:
        """buffer name -> expression registered with register_buffer / nn.Buffer"""
        return self._collect().buffers

    @property
    def bindings(self) -> dict[str, list[Binding]]:
        """attribute -> every statement of the class's methods that binds `self.<attribute>`, buffers included"""
        return self._collect().bindings

    def buffer_locals(self, name: str) -> dict[str, list[cst.BaseExpression]]:
        """The local assignments of the method that registered buffer `name`: what its names stood for."""
        return self._collect().buffer_locals.get(name, {})

    def attribute(self, name: str) -> cst.BaseExpression | None:
        """The single expression assigned to `self.<name>`, or None when absent or assigned several ways."""
        values = self._collect().attributes.get(name, [])
        if len(values) == 1:
            return values[0]
        if values and all(v.deep_equals(values[0]) for v in values):
            return values[0]
        return None


class _SelfAssignments(cst.CSTVisitor):
    def __init__(self) -> None:
        self.attributes: dict[str, list[cst.BaseExpression]] = {}
        self.buffers: dict[str, cst.BaseExpression] = {}
        # the local assignments of the method that registered each buffer (`bias = torch.tril(...)` before it)
        self.buffer_locals: dict[str, dict[str, list[cst.BaseExpression]]] = {}
        self.locals: dict[str, list[cst.BaseExpression]] = {}
        self.bindings: dict[str, list[Binding]] = {}
        self.method: cst.FunctionDef | None = None  # the method being visited
        self.depth = 0  # functions and classes open around the node visited; 1 in the method itself

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.locals = {}
        self.depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.depth += 1

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.depth -= 1

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.depth += 1

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self.depth -= 1

    def bind(self, name: str, value: cst.BaseExpression | None) -> None:
        if self.method is not None:
            known = value if self.depth <= 1 else None
            self.bindings.setdefault(name, []).append(Binding(self.method, known))

    def bind_target(self, target: cst.BaseExpression) -> None:
        """Every `self.x` that a tuple, a loop or a `with` binds, each to a value not read."""
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self.bind_target(element.value)
        elif isinstance(target, cst.StarredElement):
            self.bind_target(target.value)
        else:
            name = _self_attribute(target)
            if name is not None:
                self.bind(name, None)

    def register(self, name: str, value: cst.BaseExpression) -> None:
        self.buffers[name] = value
        self.buffer_locals[name] = self.locals

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                self.locals.setdefault(target.target.value, []).append(node.value)
            name = _self_attribute(target.target)
            if name is not None:
                self.attributes.setdefault(name, []).append(node.value)
                self.bind(name, node.value)
                if isinstance(node.value, cst.Call) and (get_full_name_for_node(node.value.func) or "").endswith(
                    "Buffer"
                ):
                    if node.value.args:
                        self.register(name, node.value.args[0].value)
            else:
                self.bind_target(target.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        name = _self_attribute(node.target)
        if name is not None and node.value is not None:
            self.attributes.setdefault(name, []).append(node.value)
            self.bind(name, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        name = _self_attribute(node.target)
        if name is not None:
            operator = _AUGMENTED.get(type(node.operator))
            value = None if operator is None else cst.BinaryOperation(node.target, operator(), node.value)
            self.bind(name, value)

    def visit_For(self, node: cst.For) -> None:
        self.bind_target(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.bind_target(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self.bind_target(node.asname.name)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "register_buffer"
            and isinstance(func.value, cst.Name)
            and func.value.value == "self"
            and len(node.args) >= 2
            and isinstance(node.args[0].value, cst.SimpleString)
        ):
            name = str(node.args[0].value.evaluated_value)
            self.register(name, node.args[1].value)
            self.bind(name, node.args[1].value)
        elif (
            isinstance(func, cst.Name)
            and func.value == "setattr"
            and len(node.args) >= 3
            and isinstance(node.args[0].value, cst.Name)
            and node.args[0].value.value == "self"
            and isinstance(node.args[1].value, cst.SimpleString)
        ):
            self.bind(str(node.args[1].value.evaluated_value), node.args[2].value)


def _assigning_methods(tree: ast.Module) -> dict[str, frozenset[str]]:
    """class -> its methods that bind `self.x`, call `self.register_buffer` or `setattr` (what _SelfAssignments
    collects)."""
    out: dict[str, frozenset[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = set(out.get(node.name, ()))  # a class defined twice: either may be the one libcst keeps
            for inner in node.body:
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found = uses(inner)
                    if found.assigns_self or "register_buffer" in found.called_on_self or "setattr" in found.called:
                        names.add(inner.name)
            out[node.name] = frozenset(names)
    return out


def _self_attribute(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return node.attr.value
    return None


@dataclass(frozen=True)
class ModuleFacts:
    """Everything the analysis needs to know about one modeling file, computed once."""

    module: cst.Module
    imports: ImportMap
    classes: dict[str, ClassInfo]
    functions: dict[str, cst.FunctionDef]
    # top-level `NAME = {...}` dict literals
    dicts: dict[str, cst.Dict]
    top_level_names: frozenset[str]
    order: tuple[str, ...] = field(default=())  # top-level class/function/assignment names in source order
    # the same file read by the standard `ast` module: cheap structural queries over whole classes
    tree: ast.Module | None = None
    # facts other modules derive from these, computed once per file (`module_sites.module_sites`)
    derived: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, module: cst.Module, tree: ast.Module | None = None) -> "ModuleFacts":
        classes: dict[str, ClassInfo] = {}
        functions: dict[str, cst.FunctionDef] = {}
        dicts: dict[str, cst.Dict] = {}
        names: set[str] = set()
        order: list[str] = []
        assigning = _assigning_methods(tree) if tree is not None else {}
        for stmt in module.body:
            if isinstance(stmt, cst.ClassDef):
                classes[stmt.name.value] = ClassInfo.of(stmt, assigning.get(stmt.name.value))
                names.add(stmt.name.value)
                order.append(stmt.name.value)
            elif isinstance(stmt, cst.FunctionDef):
                functions[stmt.name.value] = stmt
                names.add(stmt.name.value)
                order.append(stmt.name.value)
            elif isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, (cst.Assign, cst.AnnAssign)):
                        targets = (
                            [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                        )
                        for target in targets:
                            if isinstance(target, cst.Name):
                                names.add(target.value)
                                order.append(target.value)
                                if isinstance(small.value, cst.Dict):
                                    dicts[target.value] = small.value
                    elif isinstance(small, (cst.Import, cst.ImportFrom)):
                        if isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar):
                            continue
                        for alias in small.names:  # type: ignore[union-attr]
                            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                                names.add(alias.asname.name.value)
                            else:
                                names.add((get_full_name_for_node(alias.name) or "").split(".")[0])
        return cls(
            module=module,
            imports=ImportMap.of(module),
            classes=classes,
            functions=functions,
            dicts=dicts,
            top_level_names=frozenset(names),
            order=tuple(order),
            tree=tree,
        )

    def mro(self, name: str) -> list[ClassInfo]:
        """The in-file part of a class's method resolution order (single inheritance chain first)."""
        out: list[ClassInfo] = []
        seen: set[str] = set()
        stack = [name]
        while stack:
            current = stack.pop(0)
            info = self.classes.get(current)
            if info is None or current in seen:
                continue
            seen.add(current)
            out.append(info)
            stack.extend(b for b in info.bases if b in self.classes)
        return out

    def find_method(self, class_name: str, method: str) -> tuple[ClassInfo, cst.FunctionDef] | None:
        for info in self.mro(class_name):
            if method in info.methods:
                return info, info.methods[method]
        return None

    def find_attribute(self, class_name: str, attribute: str) -> cst.BaseExpression | None:
        for info in self.mro(class_name):
            if attribute in info.attributes:
                return info.attribute(attribute)
        return None

    def find_attribute_values(self, class_name: str, attribute: str) -> tuple[cst.BaseExpression, ...]:
        for info in self.mro(class_name):
            if attribute in info.attributes:
                return tuple(info.attributes[attribute])
        return ()

    def find_attribute_bindings(self, class_name: str, attribute: str) -> tuple[Binding, ...]:
        """Every binding of `self.<attribute>` in the in-file classes of the class's MRO, the class's own first: an
        inherited `__init__` or method may bind it too."""
        return tuple(b for info in self.mro(class_name) for b in info.bindings.get(attribute, ()))

    def find_buffer(self, class_name: str, buffer: str) -> cst.BaseExpression | None:
        for info in self.mro(class_name):
            if buffer in info.buffers:
                return info.buffers[buffer]
        return None

    def find_buffer_locals(self, class_name: str, buffer: str) -> dict[str, list[cst.BaseExpression]]:
        for info in self.mro(class_name):
            if buffer in info.buffers:
                return info.buffer_locals(buffer)
        return {}

    def is_subclass(self, class_name: str, base_suffix: str) -> bool:
        """True when the class derives (in-file or directly) from a class whose name ends with base_suffix."""
        for info in self.mro(class_name):
            for base in info.bases:
                if base.split(".")[-1] == base_suffix or base.endswith(base_suffix):
                    return True
        return False

    @cached_property
    def pretrained_roots(self) -> tuple[str, ...]:
        """Classes deriving directly from transformers' PreTrainedModel."""
        return tuple(
            name
            for name, info in self.classes.items()
            if any(base.split(".")[-1] == "PreTrainedModel" for base in info.bases)
        )

    @cached_property
    def _class_uses(self) -> tuple[tuple[str, Uses], ...]:
        """Each top-level class of the ast with what it calls, walked once (classes_calling is asked often)."""
        if self.tree is None:
            return ()
        return tuple((node.name, uses(node)) for node in self.tree.body if isinstance(node, ast.ClassDef))

    def classes_calling(self, names: set[str] | frozenset[str], attribute_of_self: bool = False) -> set[str]:
        """Top-level classes with a call to one of `names` (as `name(...)`, or `self.name(...)`)."""
        if self.tree is None:
            return set(self.classes)
        return {
            name
            for name, used in self._class_uses
            if not (used.called_on_self if attribute_of_self else used.called).isdisjoint(names)
        }

    def has_module_logger(self) -> bool:
        return "logger" in self.top_level_names

    def position(self, name: str) -> int:
        try:
            return self.order.index(name)
        except ValueError:
            return -1
