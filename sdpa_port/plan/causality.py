"""How the attention modules of one file are causal, read from the masks the file builds for them.

`Causality` sets `self.is_causal` on the modules the interface style moves; the checks beside it refuse (or relax) a
flag the masks contradict, and tell which implementations other than eager and sdpa the file already claims.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Sequence

import libcst as cst

from sdpa_port.analyse import chain as t
from sdpa_port.analyse.cstutil import block_body, code
from sdpa_port.analyse.mask_flow import MaskFlow
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.analyse.module_sites import Construction
from sdpa_port.analyse.sdpa_path import SdpaPath
from sdpa_port.analyse.selection import attention_dicts
from sdpa_port.plan.causal_sites import (
    PARAMETER,
    CausalSites,
    KeptMasks,
    bidirectional_only,
    check_pinned,
    decide_sites,
    every_site_causal,
    extended_masks,
    kept_masks,
)
from sdpa_port.refusals import Code, Refuse
from sdpa_port.rewrite.edit import rebase_config
from sdpa_port.rewrite.interface_edits import is_causal_assignment

CAUSAL_BUILDER = "create_causal_mask"
BIDIRECTIONAL_BUILDER = "create_bidirectional_mask"
FLASH = ("_supports_flash_attn", "_supports_flash_attn_2")
OTHER_IMPLEMENTATIONS = ("_supports_flash_attn", "_supports_flash_attn_2", "_supports_flex_attn", "_supports_attention_backend")


@dataclass(frozen=True)
class Causality:
    """How to set `self.is_causal` on the attention modules of one file.

    `is_causal` only matters to the implementations when the mask handed to them is None: a causal mask that the
    builder skipped, a bidirectional one without padding, or no mask at all. So a module whose masking all goes
    into `position_bias` is not causal; otherwise the file's mask builders decide, unless the callers pass
    `is_causal=` themselves (then the default is False and their keyword wins).
    """

    self_attention: str | None  # "True", "False", "config.is_decoder"; None when ambiguous
    from_callers: bool  # some caller passes is_causal= explicitly through **kwargs
    several_towers: bool  # token and non-token (pixel/audio) models share the file
    flow: MaskFlow = field(compare=False, repr=False)  # the masks reaching each construction, read on demand
    # nothing in the file reads `is_causal` and only eager is supported: a literal `is_causal=True` has never
    # changed a result, and may become False where only bidirectional masks reach (`check_pinned`)
    unpinnable: bool = False
    unpinned: list[Construction] = field(default_factory=list, compare=False)
    # a model class already claims an implementation other than eager (flash attention reads `is_causal` alone)
    other_implementations: bool = False
    kept: list[KeptMasks] = field(default_factory=list, compare=False)

    @classmethod
    def of(cls, facts: ModuleFacts) -> Causality:
        tree = facts.tree
        # `self.encoder(..., is_causal=True)`: a caller passes causality down through **kwargs
        from_callers = tree is not None and any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and any(k.arg == "is_causal" for k in node.keywords)
            for node in ast.walk(tree)
        )
        towers = False
        if tree is not None:
            inputs = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef) and node.name == "forward":
                    names = {a.arg for a in node.args.args + node.args.kwonlyargs}
                    if "input_ids" in names:
                        inputs.add("tokens")
                    if names & {"pixel_values", "input_features", "input_values"}:
                        inputs.add("other")
            towers = len(inputs) > 1
        others = _other_implementations(facts)
        unpinnable = tree is not None and not _reads_is_causal(tree) and not others
        return cls(self_attention_causality(facts), from_callers, towers, MaskFlow(facts), unpinnable, other_implementations=others)

    def decide(
        self, class_name: str, mask_param: str | None, key_only: tuple[str, ...]
    ) -> tuple[str | None, CausalSites | None]:
        """`self.is_causal` for the class: one value for every instance, or, where the file builds both kinds of
        self-attention mask, a constructor parameter and the sites that pass True (every site decided by the masks
        that reach it). A site receiving both kinds from call to call leaves the class False, its causal masks
        always built (`kept`); else C301 names the first site that is not decided."""
        try:
            return self.for_class(class_name, mask_param is not None), None
        except Refuse as error:
            if error.reason.code not in (Code.CAUSAL_BY_USE, Code.TOWERS) or mask_param is None:
                raise
        if every_site_causal(self.flow, class_name, mask_param, key_only):
            return "True", None
        try:
            sites = decide_sites(self.flow, class_name, mask_param, key_only)
        except Refuse as error:
            kept = None if self.other_implementations else kept_masks(self.flow, class_name, mask_param, key_only)
            if error.reason.code is not Code.CAUSAL_BY_USE or kept is None:
                raise
            self.kept.append(kept)
            return "False", None
        return ("False", None) if not sites.causal else (None, sites)

    def extended(self, class_name: str, mask_param: str, key_only: tuple[str, ...], line: int) -> KeptMasks | None:
        """The causal masks to build always for a class extending its mask over keys of its own (None where the
        masks reaching it are not followed, or flash attention, which reads `is_causal` alone, is claimed)."""
        if self.other_implementations:
            return None
        return extended_masks(self.flow, class_name, mask_param, key_only, line)

    def for_class(self, class_name: str, mask_param: bool) -> str:
        if not mask_param:
            return "False"
        if self.from_callers:
            return "False"
        if self.self_attention is None:
            raise Refuse(
                Code.CAUSAL_BY_USE,
                "the file builds causal and bidirectional self-attention masks, so whether this module is causal "
                "depends on where it is used",
                class_name,
            )
        if self.several_towers and self.self_attention != "False":
            raise Refuse(
                Code.TOWERS,
                "token and pixel/audio models share this file, and the causal mask of one tower says nothing about "
                "the other",
                class_name,
            )
        return self.self_attention


def _reads_is_causal(tree: ast.Module) -> bool:
    """Code that reads an `is_causal` attribute (`self.is_causal`, `getattr(m, "is_causal")`), stores aside."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == PARAMETER and isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.Constant) and node.value == PARAMETER:
            return True
    return False


def _other_implementations(facts: ModuleFacts, flags: Sequence[str] = OTHER_IMPLEMENTATIONS) -> bool:
    """A model class already claims an implementation other than eager (which reads `is_causal`), or one of `flags`."""
    for root in facts.pretrained_roots:
        for flag in flags:
            value = facts.classes[root].class_vars.get(flag)
            if value is not None and not (isinstance(value, cst.Name) and value.value == "False"):
                return True
    return False


def self_attention_causality(facts: ModuleFacts) -> str | None:
    """Whether the masks built for self-attention in this file are causal: "True", "False", "config.is_decoder".

    Read from the calls of transformers' mask builders; a bidirectional mask built for encoder states (with
    `encoder_hidden_states=`) serves cross-attention and does not count. None when the file builds both kinds of
    self-attention mask, so that no single value is right.
    """
    tree = facts.tree
    if tree is None:
        return None
    conditional: str | None = None
    causal = bidirectional = False
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp):
            names = {getattr(node.body, "id", None), getattr(node.orelse, "id", None)}
            if names == {CAUSAL_BUILDER, BIDIRECTIONAL_BUILDER}:
                condition = ast.unparse(node.test)
                if getattr(node.body, "id", None) == BIDIRECTIONAL_BUILDER:
                    condition = f"not ({condition})"
                conditional = code(rebase_config(cst.parse_expression(condition), to_self=False))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == CAUSAL_BUILDER:
                causal = True
            elif node.func.id == BIDIRECTIONAL_BUILDER and not any(
                k.arg == "encoder_hidden_states" for k in node.keywords
            ):
                bidirectional = True
    if conditional is not None:
        return conditional
    if causal and bidirectional:
        return None
    return "True" if causal else "False"


def dispatching_classes(facts: ModuleFacts) -> dict[str, str]:
    """Classes already calling `ALL_ATTENTION_FUNCTIONS.get_interface(..., <eager function>)`."""
    out: dict[str, str] = {}
    tree = facts.tree
    if tree is None:
        return out
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for inner in ast.walk(node):
            if (
                isinstance(inner, ast.Call)
                and isinstance(inner.func, ast.Attribute)
                and inner.func.attr in ("get_interface", "get")
                and isinstance(inner.func.value, ast.Name)
                and inner.func.value.id == "ALL_ATTENTION_FUNCTIONS"
                and len(inner.args) == 2
                and isinstance(inner.args[1], ast.Name)
            ):
                out[node.name] = inner.args[1].id
    return out


def check_own_causality(
    causality: Causality, class_name: str, mask_param: str | None, key_only: tuple[str, ...]
) -> None:
    """A module the file builds with a literal `is_causal=True` is causal whatever mask it receives.

    SDPA applies that flag whenever the mask handed over is None (no padding), where eager applies the mask alone;
    unless every mask reaching the module through that construction comes from the causal builder, the two disagree
    (BridgeTower's cross-modal layers do). The flag may follow the configuration (`is_causal=config.is_decoder`), not
    be pinned to True.
    """
    for construction in check_pinned(causality.flow, class_name, mask_param, key_only, causality.unpinnable):
        if construction.site is not None and construction not in causality.unpinned:
            causality.unpinned.append(construction)


def check_causal_attribute(facts: ModuleFacts, class_name: str, causality: Causality, mask_param: bool) -> None:
    """A module that sets `self.is_causal` to a literal the file's masks contradict would run SDPA with the wrong
    causality whenever the mask handed over is None (the eager code never reads the flag)."""
    literal = _one_literal(facts.find_attribute_values(class_name, "is_causal"))
    if literal is None:
        return
    expected = causality.for_class(class_name, mask_param)
    if expected in ("True", "False") and expected != literal:
        raise Refuse(
            Code.CAUSAL_CONTRADICTED,
            f"sets `self.is_causal = {literal}`, but the file builds {'causal' if expected == 'True' else 'bidirectional'} "
            "masks for it; the implementations would apply the flag whenever the mask is None",
            class_name,
        )


def unread_pinned(facts: ModuleFacts, class_name: str, causality: Causality) -> str | None:
    """`True`/`False` when the class pins `self.is_causal` to that literal in its own `__init__` alone, nothing in the
    file reads the flag, no implementation but eager is claimed (so the flag has never changed a result), and no
    subclass in the file sets it again; None otherwise."""
    if not causality.unpinnable:
        return None
    info = facts.classes.get(class_name)
    if info is None or "is_causal" in info.class_vars:
        return None
    values = info.attributes.get("is_causal", [])
    literal = _one_literal(values)
    if literal is None:
        return None
    init = facts.find_method(class_name, "__init__")
    if init is None or init[0].name != class_name or _pinned_assignments(init[1]) != len(values):
        return None
    subclasses = causality.flow.modules.subclasses(class_name) - {class_name}
    if any("is_causal" in facts.classes[name].attributes or "is_causal" in facts.classes[name].class_vars
           for name in subclasses if name in facts.classes):
        return None
    return literal


def _one_literal(values: Sequence[cst.BaseExpression]) -> str | None:
    """`True` or `False` when every value assigned is that one literal (names only); None otherwise."""
    literals = {v.value for v in values if isinstance(v, cst.Name) and v.value in ("True", "False")}
    if len(literals) != 1 or len(values) != len([v for v in values if isinstance(v, cst.Name)]):
        return None
    return literals.pop()


def _pinned_assignments(function: cst.FunctionDef) -> int:
    """Statements of the function body (at its top level) that are one `self.is_causal = <value>`."""
    return sum(1 for statement in block_body(function.body) if is_causal_assignment(statement))


def causality_in_chain(
    facts: ModuleFacts,
    causality: Causality,
    class_name: str,
    mask_param: str,
    cross: Sequence[str],
    path: SdpaPath,
) -> bool:
    """A module whose `self.is_causal` says True (a literal, or `is_causal=True` where it is built) while no causal
    mask ever reaches it: eager's causality is the chain's own, a causal buffer filled in it or none, and the
    interface hands every fill over in `position_bias`. Passing `is_causal=False` to the implementations is then
    exact whatever the flag (Bark's causal blocks are built with `is_causal=True` and given bidirectional masks;
    left to the flag, sdpa would add a top-left causal mask, and crop the keys to the queries' length after a
    cache). Flash attention ignores `position_bias`: where the chain fills and the file claims flash, the class must
    not serve it (an attention-classes dict gives flash another class, and the class is built through one only)."""
    if bidirectional_only(causality.flow, class_name, mask_param, cross) is not None:
        return False
    if not any(isinstance(op, t.Fill) for op in path.chain_ops):
        return True
    if not _other_implementations(facts, FLASH):
        return True
    return _flash_elsewhere(facts, causality, class_name)


def _flash_elsewhere(facts: ModuleFacts, causality: Causality, class_name: str) -> bool:
    """Flash attention never runs the class: an attention-classes dict gives flash another class, and the class is
    built through such dicts only."""
    dicts = [entries for entries in attention_dicts(facts).values() if entries["eager"] == class_name]
    elsewhere = all(any(k.startswith("flash") and v != class_name for k, v in e.items()) for e in dicts)
    sites = causality.flow.modules.sites_of({class_name} | causality.flow.modules.subclasses(class_name))
    return bool(dicts) and elsewhere and not any(site.direct for site in sites)


def claims_reaching(facts: ModuleFacts, causality: Causality, class_name: str) -> bool:
    """An implementation the file already claims, other than eager and sdpa, may run the class: flex or registered
    kernels (every other implementation falls back to it), or flash where no dict gives flash another class."""
    if _other_implementations(facts, ("_supports_flex_attn", "_supports_attention_backend")):
        return True
    return _other_implementations(facts, FLASH) and not _flash_elsewhere(facts, causality, class_name)


__all__ = [
    "FLASH",
    "OTHER_IMPLEMENTATIONS",
    "Causality",
    "causality_in_chain",
    "check_causal_attribute",
    "check_own_causality",
    "claims_reaching",
    "dispatching_classes",
    "self_attention_causality",
    "unread_pinned",
]
