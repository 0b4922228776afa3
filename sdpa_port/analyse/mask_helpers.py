"""Which calls reach Transformers' own 4.x mask helpers, whose `_for_sdpa` twins a class-style port may call instead.

A call is Transformers' own helper only when it resolves to it:
- `_prepare_4d_causal_attention_mask(...)` / `_prepare_4d_attention_mask(...)`: a name the file imports from
  transformers' `modeling_attn_mask_utils`, absolutely or relatively from the package its `PreTrainedModel` comes
  from (a remote repository's own `from .modeling_attn_mask_utils import ...` is its copy), and that the file does
  not bind again itself;
- `self.get_extended_attention_mask(...)`: called in a method of a class that no in-file class defines it for (an
  ancestor, or a subclass whose instances run the method), and whose ancestry leaves the file only through
  transformers' `PreTrainedModel` or `ModuleUtilsMixin` (a base of another library may define it, with another
  signature: LAVIS's Q-Former takes `is_decoder`).

Any other call of the same name keeps its call; its result is a float mask like any other. The `_for_sdpa` twins
a file may already call itself (PLBart's model code is Bart's) are known by the same rules (read-only, pure).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.names import ImportMap

CAUSAL = "_prepare_4d_causal_attention_mask"
PLAIN = "_prepare_4d_attention_mask"
EXTENDED = "get_extended_attention_mask"
SDPA_SUFFIX = "_for_sdpa"
CAUSAL_SDPA = CAUSAL + SDPA_SUFFIX
PLAIN_SDPA = PLAIN + SDPA_SUFFIX
FUNCTIONS = (CAUSAL, PLAIN, CAUSAL_SDPA, PLAIN_SDPA)
CAUSAL_FUNCTIONS = (CAUSAL, CAUSAL_SDPA)  # the others build masks that are not causal
MASK_UTILS = "modeling_attn_mask_utils"
MODEL_UTILS = "modeling_utils"
# transformers' classes that give `get_extended_attention_mask` (ModuleUtilsMixin defines it, PreTrainedModel has it)
EXTENDED_OWNERS = ("PreTrainedModel", "ModuleUtilsMixin")


@dataclass(frozen=True)
class MaskHelpers:
    """Transformers' own mask helpers as this file reaches them."""

    functions: dict[str, str]  # local name -> the function of transformers it is (one of FUNCTIONS)
    extended: frozenset[str]  # classes whose `self.get_extended_attention_mask` is Transformers' own

    @classmethod
    def of(cls, facts: ModuleFacts) -> "MaskHelpers":
        roots = _transformers_roots(facts.imports)
        bound = _bound_at_top_level(facts.tree)
        functions: dict[str, str] = {}
        for local, qualified in facts.imports.aliases.items():
            module, _, name = qualified.rpartition(".")
            if name in FUNCTIONS and local not in bound and module in {root + MASK_UTILS for root in roots}:
                functions[local] = name
        extended = frozenset(name for name in facts.classes if _inherits_extended(facts, name, roots))
        return cls(functions, extended)

    def function(self, name: str) -> str | None:
        """The helper with a `_for_sdpa` twin a called name is (CAUSAL or PLAIN), or None when it is not
        Transformers' own."""
        found = self.functions.get(name)
        return found if found in (CAUSAL, PLAIN) else None

    def builder(self, name: str) -> str | None:
        """Transformers' function a called name is, twins included (one of FUNCTIONS), or None."""
        return self.functions.get(name)

    def called(self, node: ast.Call, class_name: str | None) -> str | None:
        """Transformers' helper (twins included) an `ast` call in a method of `class_name` (None outside classes)
        reaches, or None."""
        func = node.func
        if isinstance(func, ast.Name):
            return self.builder(func.id)
        if (
            isinstance(func, ast.Attribute)
            and func.attr == EXTENDED
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and class_name in self.extended
        ):
            return EXTENDED
        return None

    def used(self, facts: ModuleFacts) -> dict[str, frozenset[str]]:
        """Class -> the Transformers helpers its methods call."""
        out: dict[str, frozenset[str]] = {}
        if facts.tree is None:
            return out
        for node in facts.tree.body:
            if isinstance(node, ast.ClassDef):
                found = {h for call in ast.walk(node) if isinstance(call, ast.Call) for h in [self.called(call, node.name)] if h}
                if found:
                    out[node.name] = frozenset(found)
        return out


def _transformers_roots(imports: ImportMap) -> set[str]:
    """How the file names the transformers package: `transformers.`, and the relative prefix (`...`) of the package
    its `PreTrainedModel` is imported from, when that is relative (a file inside transformers' models tree)."""
    roots = {"transformers."}
    for qualified in imports.aliases.values():
        if qualified.startswith(".") and qualified.endswith(f"{MODEL_UTILS}.PreTrainedModel"):
            roots.add(qualified[: -len(f"{MODEL_UTILS}.PreTrainedModel")])
    return roots


def _bound_at_top_level(tree: ast.Module | None) -> set[str]:
    """Names the file binds itself at its top level (a function, a class, an assignment): they shadow an import."""
    out: set[str] = set()
    if tree is None:
        return out
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _inherits_extended(facts: ModuleFacts, class_name: str, roots: set[str]) -> bool:
    """No in-file ancestor defines `get_extended_attention_mask`, nor any in-file class deriving from this one (its
    instances would call theirs through the inherited method), and the ancestry leaves the file only through
    transformers' PreTrainedModel or ModuleUtilsMixin (at least once)."""
    if any(EXTENDED in other.methods for other in facts.classes.values() if class_name in _lineage(facts, other.name)):
        return False
    reached = False
    for info in facts.mro(class_name):
        if EXTENDED in info.methods:
            return False
        for base in info.bases:
            if base in facts.classes:
                continue
            if not _transformers_class(facts.imports, base, roots):
                return False
            reached = True
    return reached


def _lineage(facts: ModuleFacts, class_name: str) -> set[str]:
    return {info.name for info in facts.mro(class_name)}


def _transformers_class(imports: ImportMap, base: str, roots: set[str]) -> bool:
    head, _, rest = base.partition(".")
    qualified = imports.aliases.get(head)
    if qualified is None:
        return False
    qualified = f"{qualified}.{rest}" if rest else qualified
    module, _, name = qualified.rpartition(".")
    return name in EXTENDED_OWNERS and module in {"transformers"} | {root + MODEL_UTILS for root in roots}


__all__ = ["CAUSAL", "CAUSAL_FUNCTIONS", "CAUSAL_SDPA", "EXTENDED", "PLAIN", "PLAIN_SDPA", "SDPA_SUFFIX", "MaskHelpers"]
