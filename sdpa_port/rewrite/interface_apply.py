"""The interface style's edits to a file, made as its plan says: classes moved onto the interface, flags set.

`plan/interface_style.py` decides (`InterfacePlan`); `apply_interface` makes the edits in order, the ones that
find their targets by the analysed file's lines first. The CST transformers it runs are in `interface_edits.py`.
"""

from __future__ import annotations

import ast
import io
import tokenize

import libcst as cst

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.plan.causal_sites import PARAMETER, CausalSites
from sdpa_port.plan.interface_plan import InterfacePlan, ModulePlan
from sdpa_port.render import render_module
from sdpa_port.rewrite import flags, imports, insert_classes
from sdpa_port.rewrite.alibi_masks import accept_4d_masks
from sdpa_port.rewrite.causal_sites import pass_is_causal, unpin_is_causal
from sdpa_port.rewrite.eager_masks import give_eager_form
from sdpa_port.rewrite.export_positions import shift_ranges
from sdpa_port.rewrite.interface_edits import DictLookup, InitAttributes, PassConfig, ReplaceMethods
from sdpa_port.rewrite.kept_masks import keep_causal_masks
from sdpa_port.rewrite.targeted import transform_named
from sdpa_port.rewrite.thread_kwargs import thread_kwargs
from sdpa_port.rewrite.unconverted_masks import unconvert


def apply_interface(module: cst.Module, facts: ModuleFacts, plan: InterfacePlan) -> cst.Module:
    """The file with the plan's edits made, each step's notes added to the plan's, in order."""
    module = _masks_as_analysed(module, plan)  # first, while the lines are the analysed file's
    needed: list[tuple[str, str | None]] = [("modeling_utils", "ALL_ATTENTION_FUNCTIONS")] if plan.modules else []
    for item in plan.modules:
        module = _move_class(module, facts, item, plan.notes)
    module = _insert_functions(module, plan)
    for class_name in plan.flag_only:
        module = _flag_only(module, facts, plan, class_name)
    module = _file_edits(module, facts, plan)
    if plan.threading is not None:
        module, threaded = thread_kwargs(module, plan.threading)
        plan.notes.extend(threaded)
    for item in plan.modules:
        unused = [name for name in item.inlined if not _referenced(module, item.class_name, name)]
        if unused:
            module = transform_named(module, {item.class_name}, ReplaceMethods(dict.fromkeys(unused)))
            plan.notes.append(f"{item.class_name}: " + ", ".join(unused) + " moved into the eager function, removed")
    for root in facts.pretrained_roots:
        module = flags.set_class_flag(module, [root], "_supports_sdpa")
        plan.notes.append(f"{root}._supports_sdpa = True")
        if plan.attention_backend:
            # every layer hands its callers' kwargs to the implementation, as vLLM's and other backends require
            module = flags.set_class_flag(module, [root], "_supports_attention_backend")
            plan.notes.append(f"{root}._supports_attention_backend = True")
    return imports.add_imports(module, facts.imports, needed)


def _masks_as_analysed(module: cst.Module, plan: InterfacePlan) -> cst.Module:
    """The mask builders' edits found by the analysed file's lines: kept masks, eager forms, dropped conversions."""
    for kept in plan.kept:
        module, count = keep_causal_masks(module, kept.builders)
        assert count == len(kept.builders), "planning checked each builder call takes the keyword"
        plan.notes.extend(kept.notes())
    if plan.eager_masks is not None:
        module = give_eager_form(module, plan.eager_masks)
        plan.notes.append(plan.eager_masks.note())
    lines = frozenset().union(*(item.unconverted for item in plan.modules))
    if lines:
        module, count = unconvert(module, lines)
        assert count == len(lines), "planning found each conversion on its line"
        plan.notes.append(
            "the masks built at line(s) " + ", ".join(str(n) for n in sorted(lines)) + " are handed over as built, "
            "not converted to booleans; the eager attention adds them where it filled (exact: `finfo.min` absorbs)"
        )
    return module


def _move_class(module: cst.Module, facts: ModuleFacts, item: ModulePlan, notes: list[str]) -> cst.Module:
    """One class moved onto the interface: its new forward, its `__init__` attributes and its constructions."""
    module = transform_named(module, {item.class_name}, ReplaceMethods({"forward": item.forward}))
    init_owner = _init_owner(facts, item.class_name)
    if item.store_config or item.is_causal is not None or item.causal_sites is not None:
        causal = PARAMETER if item.causal_sites is not None else item.is_causal
        init = InitAttributes(
            item.store_config, causal, causal_parameter=item.causal_sites is not None, replace=item.replaces_pinned
        )
        module = transform_named(module, {init_owner}, init)
    if item.add_config_parameter:
        owners = facts.classes_calling({item.class_name})
        transformer = PassConfig(item.class_name)
        module = transform_named(module, owners - {item.class_name}, transformer)
        assert not transformer.missing, "planning checked every construction has a config in scope"
        notes.append(f"{item.class_name} takes `config` ({transformer.count} construction(s) pass it)")
    notes.append(f"{item.class_name} dispatches through ALL_ATTENTION_FUNCTIONS with {item.eager.name.value}")
    notes.extend(_module_notes(item))
    if item.causal_sites is not None:
        module = _pass_causal(module, item.causal_sites, notes)
    return module


def _insert_functions(module: cst.Module, plan: InterfacePlan) -> cst.Module:
    """The fold function and the eager functions, each right before the first class that uses it."""
    if plan.fold_function is not None:
        first = next(item.class_name for item in plan.modules if item.fold_called)
        module = _insert_before(module, first, render_module("interface_style/fold_terms.py.jinja", name=plan.fold_function).body[0])
        plan.notes.append(f"{plan.fold_function}: folds additive terms into the mask handed to the implementations")
    for item in plan.modules:
        module = _insert_before(module, item.class_name, item.eager)
    return module


def _flag_only(module: cst.Module, facts: ModuleFacts, plan: InterfacePlan, class_name: str) -> cst.Module:
    """A class already on the interface given its `is_causal`: one value, or a parameter its causal sites pass."""
    causal = plan.causal_for_flag_only.get(class_name)
    if causal is not None:
        module = transform_named(module, {_init_owner(facts, class_name)}, InitAttributes(False, causal))
        plan.notes.append(f"{class_name}.is_causal = {causal}")
    sites = plan.flag_only_sites.get(class_name)
    if sites is not None:
        init = InitAttributes(False, PARAMETER, causal_parameter=True)
        module = transform_named(module, {_init_owner(facts, class_name)}, init)
        module = _pass_causal(module, sites, plan.notes)
    return module


def _file_edits(module: cst.Module, facts: ModuleFacts, plan: InterfacePlan) -> cst.Module:
    """The edits outside the moved classes: dict lookups, position ranges, ALiBi builders, unpinned constructions."""
    for dict_name, eager_class in plan.dicts.items():
        owners = _classes_reading(facts, dict_name)
        module = transform_named(module, owners, DictLookup(dict_name, eager_class))
        plan.notes.append(f"{dict_name} lookups fall back to {eager_class} for every other implementation")
    if plan.shifted_ranges:
        module = shift_ranges(module, {owner for owner, _ in plan.shifted_ranges})
        plan.notes.extend(
            f"{owner} line {line}: torch.arange(past, n + past) -> torch.arange(n) + past (exports with a static cache)"
            for owner, line in plan.shifted_ranges
        )
    for builder in plan.alibi.builders if plan.alibi is not None else ():
        module = accept_4d_masks(module, builder)
        plan.notes.append(f"`{builder.function}` also takes 4-D masks (continuous batching)")
    for construction in plan.unpinned:
        assert construction.site is not None
        module, count = unpin_is_causal(module, construction.class_name, construction.site.key)
        assert count == 1, "planning followed this construction to its site"
        plan.notes.append(
            f"{construction.site.name} (line {construction.line}) builds {construction.class_name} with "
            "is_causal=False: only bidirectional masks reach it, the eager computation never read the flag, and the "
            "other implementations would have made it causal"
        )
    return module


def _module_notes(item: ModulePlan) -> list[str]:
    """What the report says of one moved class beyond its dispatch."""
    notes = []
    if item.updates_with_kwargs:
        notes.append(
            f"{item.class_name}.forward passes its kwargs to {item.updates_with_kwargs} cache update(s), which "
            "the release's paged cache takes (`update(..., kwargs=kwargs)`, as its models call it)"
        )
    if item.replaces_pinned:
        notes.append(
            f"{item.class_name} pinned `self.is_causal` to a literal that nothing in the file reads and only eager "
            "ran with: the flag is set from the masks the module receives instead"
        )
    if item.is_causal is not None:
        notes.append(f"{item.class_name}.is_causal = {item.is_causal}")
    return notes


def _pass_causal(module: cst.Module, sites: CausalSites, notes: list[str]) -> cst.Module:
    """The class's causal sites pass `is_causal=True`, with the notes saying so."""
    module, count = pass_is_causal(module, sites.class_name, [site.key for site in sites.causal])
    assert count >= len(sites.causal), "planning checked every causal site builds the class by name"
    notes.append(
        f"{sites.class_name} takes `is_causal` (default False); "
        + ", ".join(site.name for site in sites.causal)
        + " pass(es) `is_causal=True`"
    )
    notes.extend(sites.notes())
    return module


def _init_owner(facts: ModuleFacts, class_name: str) -> str:
    """The class whose `__init__` the class runs: its own, or the nearest base's."""
    found = facts.find_method(class_name, "__init__")
    return found[0].name if found is not None else class_name


def _classes_reading(facts: ModuleFacts, name: str) -> set[str]:
    """The top-level classes of the file that read the name anywhere."""
    out: set[str] = set()
    if facts.tree is None:
        return out
    for node in facts.tree.body:
        if isinstance(node, ast.ClassDef) and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node)):
            out.add(node.name)
    return out


def _insert_before(module: cst.Module, anchor: str, statement: cst.BaseStatement) -> cst.Module:
    """The module with the statement right before the class named `anchor`."""
    body: list[cst.BaseStatement] = []
    done = False
    for existing in module.body:
        if not done and isinstance(existing, cst.ClassDef) and existing.name.value == anchor:
            body.append(statement.with_changes(leading_lines=insert_classes.TWO_BLANK_LINES))
            done = True
        body.append(existing)
    if not done:
        raise KeyError(anchor)
    return module.with_changes(body=body)


def _referenced(module: cst.Module, class_name: str, name: str) -> bool:
    """Whether anything in the module still names the method: an attribute, a name, a string of the name alone, or
    a `# Copied from` (or other) comment naming `Class.method`."""
    tree = ast.parse(module.code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == name or isinstance(node, ast.Name) and node.id == name:
            return True
        if isinstance(node, ast.Constant) and node.value == name:  # getattr(self, "name")
            return True
    tokens = tokenize.generate_tokens(io.StringIO(module.code).readline)
    comments = (token.string for token in tokens if token.type == tokenize.COMMENT)
    return any(f"{class_name}.{name}" in comment for comment in comments)


__all__ = ["apply_interface"]
