"""Decide `is_causal` per construction of an attention class, from the masks the mask flow shows reach it.

transformers 5.x gives a module used both ways an `is_causal` constructor argument and passes `is_causal=True` where
it is built for causal masks (BART's decoder self-attention) and nothing elsewhere (its encoder, every
cross-attention). A site is decided when every mask reaching it comes from one kind of builder. A site that
receives both kinds from call to call (BLIP's text model picks its builder by an `is_decoder` argument) cannot carry
the choice in `is_causal`; there the mask carries it (`kept_masks`). A file with a site that is neither stays
refused, with the site named.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Sequence

from sdpa_port.analyse.mask_flow import MaskFlow
from sdpa_port.analyse.mask_values import Kind, SiteMasks
from sdpa_port.analyse.module_sites import Construction, Site
from sdpa_port.refusals import Code, Refuse

PARAMETER = "is_causal"


@dataclass(frozen=True)
class CausalSites:
    """An attention class that takes `is_causal` (default False), and the sites that pass `is_causal=True`."""

    class_name: str
    causal: tuple[Site, ...]
    decided: tuple[SiteMasks, ...]  # every site, with the masks that decided it

    def notes(self) -> list[str]:
        return [
            f"{masks.site.name} (line {masks.site.line}) builds {self.class_name} with is_causal="
            f"{'True' if masks.causal else 'False'}: {masks.why()}"
            for masks in self.decided
        ]


@dataclass(frozen=True)
class KeptMasks:
    """An attention class some construction of which receives causal and bidirectional masks from call to call.

    `is_causal` stays False for every instance, and each `create_causal_mask` call reaching the class builds its mask
    under every implementation (`allow_is_causal_skip=False`): sdpa then applies the causality the mask carries,
    where it would otherwise get None and a flag that cannot be right for both kinds of call. Exact for eager (its
    mask is always built), sdpa and flex (the block mask carries the causality too); flash attention takes its
    causality from `is_causal` alone, so a file claiming it is not handled this way.
    """

    class_name: str
    builders: frozenset[int]  # lines of the `create_causal_mask(...)` calls whose masks reach the class
    mixed: tuple[SiteMasks, ...]  # the constructions receiving both kinds
    extended: int | None = None  # or: the line where the module extends its mask over keys of its own
    beside: str | None = None  # or: the test of a branch kept eager beside the dispatch that reads the mask

    def notes(self) -> list[str]:
        lines = ", ".join(str(line) for line in sorted(self.builders))
        if self.beside is not None:
            why = (
                f"{self.class_name} keeps code beside its dispatch (under `if {self.beside}:`) that reads the mask in "
                "eager's form, which follows from sdpa's only where the mask is built"
            )
        elif self.extended is not None:
            why = (
                f"{self.class_name} extends its mask over keys of its own (line {self.extended}), which `is_causal` "
                "cannot see"
            )
        else:
            why = f"{self.class_name}.is_causal = False: " + "; ".join(
                f"`{masks.site.name}` (line {masks.site.line}): {masks.why()}" for masks in self.mixed
            )
        if not self.builders:
            return [f"{why}; no causal mask reaches it"]
        return [
            f"{why}; the causal masks (line(s) {lines}) are always built (`allow_is_causal_skip=False`), so they "
            "carry the causality under sdpa"
        ]


def kept_masks(flow: MaskFlow, class_name: str, mask_param: str, key_only: Sequence[str]) -> KeptMasks | None:
    """The class's causality carried by its masks, where every construction is followed, every mask reaching it comes
    straight from a builder (or is None), and some construction receives both kinds; None otherwise."""
    found = _built_masks(flow, class_name, mask_param, key_only)
    if isinstance(found, str) or not found[1]:
        return None
    return KeptMasks(class_name, found[0], found[1])


def extended_masks(
    flow: MaskFlow, class_name: str, mask_param: str, key_only: Sequence[str], line: int
) -> KeptMasks | None:
    """A class extending its mask over keys of its own (MVP's prompt keys): sdpa's causal shortcut (None and
    `is_causal`) would not cover them (transformers' sdpa even crops the keys to the query's length then), so every
    causal mask reaching the class is always built; None where a mask reaching it is not followed to a builder."""
    found = _built_masks(flow, class_name, mask_param, key_only)
    if isinstance(found, str):
        return None
    return KeptMasks(class_name, found[0], (), extended=line)


def _built_masks(
    flow: MaskFlow, class_name: str, mask_param: str, key_only: Sequence[str], every_call: bool = False
) -> tuple[frozenset[int], tuple[SiteMasks, ...]] | str:
    """The lines of the causal builders whose masks reach the class and the constructions that receive both kinds;
    otherwise why not: a construction is not followed, or a mask reaching it does not come straight from a builder
    (or None). With `every_call`, cross-attention calls count too, and a class never built or a site never called
    is a reason."""
    sites = _followed_sites(flow, class_name, built=every_call)
    if isinstance(sites, str):
        return sites
    builders: set[int] = set()
    mixed: list[SiteMasks] = []
    for site in sites:
        masks = flow.site_masks(site, class_name, mask_param, key_only, cross_origins=every_call)
        uncalled = every_call and not masks.calls and not masks.cross_calls
        unbuilt = any(o.kind not in (Kind.CAUSAL, Kind.BIDIRECTIONAL, Kind.NONE) or o.to_bool for o in masks.origins)
        if uncalled or unbuilt:
            return f"`{site.name}` (line {site.line}): {masks.why()}"
        builders |= {o.line for o in masks.origins if o.kind is Kind.CAUSAL}
        if Kind.CAUSAL in masks.kinds and len(masks.kinds) > 1:
            mixed.append(masks)
    return frozenset(builders), tuple(mixed)


def _classes(flow: MaskFlow, class_name: str) -> set[str]:
    """The class and its in-file subclasses: all run the forward that reads `self.is_causal`."""
    return {class_name} | flow.modules.subclasses(class_name)


def _unfollowed(flow: MaskFlow, classes: set[str]) -> Construction | None:
    return next((c for c in flow.modules.constructions() if c.class_name in classes and c.site is None), None)


def decide_sites(flow: MaskFlow, class_name: str, mask_param: str, key_only: Sequence[str]) -> CausalSites:
    """Every site of `class_name` decided from its masks; raises C301 naming the first site that is not."""
    ambiguous = "the file builds causal and bidirectional self-attention masks"
    classes = _classes(flow, class_name)
    outside = _unfollowed(flow, classes)
    if outside is not None:
        raise Refuse(
            Code.CAUSAL_BY_USE,
            f"{ambiguous}, and `{outside.class_name}` is built at line {outside.line} outside a module attribute, so "
            "the masks it receives cannot be followed",
            class_name,
        )
    decided: list[SiteMasks] = []
    causal: list[Site] = []
    init = flow.modules.method(class_name, "__init__")
    for site in flow.modules.sites_of(classes):
        masks = flow.site_masks(site, class_name, mask_param, key_only)
        if masks.causal is None:
            raise Refuse(
                Code.CAUSAL_BY_USE,
                f"{ambiguous}; whether `{site.name}` (built at line {site.line}) is causal cannot be shown: {masks.why()}",
                class_name,
            )
        decided.append(masks)
        if not masks.causal:
            continue
        own_init = {flow.modules.method(name, "__init__") == init for name in site.classes if name in classes}
        if not site.direct or own_init != {True} or not set(site.classes) <= classes:
            raise Refuse(
                Code.CAUSAL_BY_USE,
                f"{ambiguous}; `{site.name}` (line {site.line}) receives causal masks, but it is not built by calling "
                f"`{class_name}` by name, so `is_causal=True` cannot be passed there",
                class_name,
            )
        causal.append(site)
    if causal and not _takes_new_parameter(init[1] if init is not None else None):
        raise Refuse(
            Code.CAUSAL_BY_USE,
            f"{ambiguous}; `{causal[0].name}` receives causal masks, but `{class_name}` has no `__init__` of its own "
            "that can take an `is_causal` keyword (none in this file, `*args`, or an `is_causal` it does not store)",
            class_name,
        )
    return CausalSites(class_name, tuple(causal), tuple(decided))


def every_site_causal(flow: MaskFlow, class_name: str, mask_param: str, key_only: Sequence[str]) -> bool:
    """Every construction of the class is followed and receives causal masks alone: one `is_causal = True` for all
    its instances holds, however they are built (through a dict of classes too)."""
    classes = _classes(flow, class_name)
    if _unfollowed(flow, classes) is not None:
        return False
    sites = list(flow.modules.sites_of(classes))
    return bool(sites) and all(flow.site_masks(site, class_name, mask_param, key_only).causal is True for site in sites)


def _takes_new_parameter(init: ast.FunctionDef | None) -> bool:
    if init is None:
        return False
    args = init.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    return args.vararg is None and PARAMETER not in names


def check_pinned(
    flow: MaskFlow, class_name: str, mask_param: str | None, key_only: Sequence[str], unpinnable: bool = False
) -> list[Construction]:
    """A construction passing a literal `is_causal=True` that builds `class_name` (itself, or a module holding it)
    stands only when every mask reaching `class_name` through it is causal; otherwise C302 names it.

    With `unpinnable` (nothing in the file reads `is_causal` and no implementation but eager is supported yet, so
    the flag has never changed a result), a construction that only bidirectional masks or none reach is returned
    instead: passing `is_causal=False` there keeps every implementation to what eager computes."""
    unpinned: list[Construction] = []
    classes = _classes(flow, class_name)
    for pinned in flow.modules.constructions():
        if not pinned.pinned:
            continue
        built = pinned.class_name
        inside = set(flow.modules.mro(built)) | {n for c in flow.modules.contained(built) for n in flow.modules.mro(c)}
        sites = [
            s
            for s in flow.modules.sites_of(classes)
            if s.owner in inside or (pinned.site is not None and s == pinned.site)
        ]
        if not sites and built not in classes:
            continue
        start = f"`{built}` is built with `is_causal=True` at line {pinned.line}"
        if pinned.site is None or mask_param is None:
            why = "it is not assigned to a module attribute" if pinned.site is None else "the module takes no mask"
            raise Refuse(
                Code.CAUSAL_PINNED,
                f"{start}; whether the masks it receives are causal cannot be shown: {why}",
                class_name,
            )
        restrict = None if built in classes else (built, pinned.site.key)
        reached = [
            (site, flow.site_masks(site, class_name, mask_param, key_only, restrict))
            for site in sites
            if not (built in classes and site != pinned.site)
        ]
        if unpinnable and reached and all(masks.causal is False for _, masks in reached):
            unpinned.append(pinned)
            continue
        for site, masks in reached:
            if masks.causal is True:
                continue
            through = f" (`{pinned.site.name}`)" + (
                f", and builds `{class_name}` at `{site.name}`" if site != pinned.site else ""
            )
            not_causal = masks.not_causal()
            if not_causal is not None:
                detail = f"{start}{through}, but masks that are not causal reach it: {not_causal}"
            else:
                detail = f"{start}{through}; whether the masks it receives are causal cannot be shown: {masks.why()}"
            raise Refuse(Code.CAUSAL_PINNED, detail, class_name)
    return unpinned


def dispatched_mask(function: ast.FunctionDef) -> str | None:
    """The forward parameter a module already on the interface hands over as its mask:
    `attention_interface(self, query, key, value, <mask>, ...)`."""
    params = {a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]}
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and len(node.args) >= 5
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "self"
            and isinstance(node.args[4], ast.Name)
            and node.args[4].id in params
        ):
            return node.args[4].id
    return None


__all__ = [
    "PARAMETER",
    "CausalSites",
    "KeptMasks",
    "bidirectional_only",
    "builders_only",
    "check_pinned",
    "decide_sites",
    "dispatched_mask",
    "eager_form_builders",
    "every_site_causal",
    "extended_masks",
    "kept_masks",
]


def _followed_sites(flow: MaskFlow, class_name: str, built: bool = True) -> list[Site] | str:
    """The sites building `class_name` (or an in-file subclass), or why its masks cannot be followed: a construction
    outside a module attribute, or (with `built`) none in the file."""
    classes = _classes(flow, class_name)
    outside = _unfollowed(flow, classes)
    if outside is not None:
        return f"`{outside.class_name}` is built at line {outside.line} outside a module attribute"
    sites = list(flow.modules.sites_of(classes))
    return sites if sites or not built else "it is never built in this file"


def eager_form_builders(
    flow: MaskFlow, class_name: str, mask_param: str, key_only: Sequence[str]
) -> frozenset[int] | str:
    """The lines of the `create_causal_mask` calls whose masks reach `class_name` (self- and cross-attention calls
    alike) where eager's mask follows from the one the current implementation gets for every mask reaching it;
    otherwise why not. It does for `create_bidirectional_mask` (see `bidirectional_only`) and for
    `create_causal_mask` once the port makes each of these calls build its mask under every implementation
    (`allow_is_causal_skip=False`): sdpa's is then always the boolean mask that eager's builder turns into 0 and the
    dtype's minimum, never None."""
    found = _built_masks(flow, class_name, mask_param, key_only, every_call=True)
    return found if isinstance(found, str) else found[0]


def builders_only(flow: MaskFlow, class_name: str, mask_param: str, key_only: Sequence[str]) -> str | None:
    """None when every mask reaching `class_name` (self- and cross-attention calls alike) comes as built from
    `create_causal_mask` or `create_bidirectional_mask`, or one of them chosen by a condition, or is None; otherwise
    why not. Such a mask is what transformers builds for the implementation the config names: flash attention's 2-D
    padding mask or None, never one the file built or changed itself."""
    sites = _followed_sites(flow, class_name)
    if isinstance(sites, str):
        return sites
    for site in sites:
        masks = flow.site_masks(site, class_name, mask_param, key_only, cross_origins=True)
        built = (Kind.CAUSAL, Kind.BIDIRECTIONAL, Kind.CONDITIONAL, Kind.NONE)
        if not masks.origins or any(o.kind not in built or o.to_bool for o in masks.origins):
            return f"`{site.name}` (line {site.line}): {masks.why()}"
    return None


def bidirectional_only(flow: MaskFlow, class_name: str, mask_param: str, key_only: Sequence[str]) -> str | None:
    """None when every mask reaching `class_name` comes from `create_bidirectional_mask` (or is None); otherwise why
    not. Such a mask is the eager one with its additive values turned into booleans: transformers' eager builder
    is sdpa's boolean mask with 0 where it keeps and the dtype's minimum where it masks, and both skip the same
    masks (None without padding)."""
    sites = _followed_sites(flow, class_name)
    if isinstance(sites, str):
        return sites
    for site in sites:
        masks = flow.site_masks(site, class_name, mask_param, key_only)
        if masks.cross_calls or not masks.calls:
            return f"`{site.name}` (line {site.line}): " + (
                "it serves cross-attention" if masks.cross_calls else masks.why()
            )
        if any(o.kind not in (Kind.BIDIRECTIONAL, Kind.NONE) or o.to_bool for o in masks.origins):
            return f"`{site.name}` (line {site.line}): {masks.why()}"
    return None
