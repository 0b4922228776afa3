"""Whether an interface-style port may run under flash attention: the static half of `_supports_flash_attn`.

Transformers' flash path (`integrations/flash_attention.py`) reads less than sdpa does. It takes the mask as a 2-D
padding mask or None (what `masking_utils` builds for it), applies `causal=module.is_causal` (or the `is_causal`
keyword) whatever the mask, and drops every other keyword: `position_bias`, and any extra term the eager function
takes by keyword. So the port may ask for flash only where each attention it dispatches is a plain masked attention:

- the release offers `flash_attention_2` in `ALL_ATTENTION_FUNCTIONS` (`discover/release.py`);
- the conditions of `_supports_attention_backend` hold: every layer hands its callers' kwargs over (flash reads
  `position_ids` and packed sequence lengths from them), no additive term goes as `position_bias` or is folded into
  a float mask, no causality rides on masks always built (flash sees a 2-D mask), no mask takes eager's form;
- the eager functions take nothing by keyword only (GPT-Neo's `causal_mask`, `mask_value`: flash drops them);
- every mask reaching a dispatch comes, as built, from `create_causal_mask` or `create_bidirectional_mask` (or is
  None), called without `or_mask_function`/`and_mask_function` (flash's mask ignores them): a sliding-window
  builder's window reaches flash only as `sliding_window=`, which the port never passes;
- no module serves cross-attention: with keys longer than the queries, transformers' flash path unpads the queries
  with the last columns of the keys' padding mask (`_upad_input`), which eager does not do;
- every class dispatching is moved by the port (a class already on the interface was not read).

The causality itself is the port's own proof (`plan/causality.py`): `self.is_causal` is True exactly where causal
masks reach. Where every condition holds, `--verify` still runs the port through transformers' flash path with a
stand-in kernel before the flag is set (`verify/flash_claim.py`):

```python
# before (the port as planned)                     # after (verified, flash ran and matched eager)
class CodeGenPreTrainedModel(PreTrainedModel):      class CodeGenPreTrainedModel(PreTrainedModel):
    _supports_sdpa = True                               _supports_sdpa = True
                                                        _supports_flash_attn = True
```
"""

from __future__ import annotations

import ast

from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.discover.release import Release
from sdpa_port.plan.causal_sites import builders_only
from sdpa_port.plan.causality import BIDIRECTIONAL_BUILDER, CAUSAL_BUILDER, Causality
from sdpa_port.plan.interface_plan import InterfacePlan

FLASH_FLAG = "_supports_flash_attn"
# keywords of the mask builders whose masks flash's own (a 2-D padding mask) does not carry
MASK_FUNCTIONS = ("or_mask_function", "and_mask_function")


def no_flash(plan: InterfacePlan, facts: ModuleFacts, causality: Causality, release: Release | None) -> str:
    """Why the port may not claim flash attention, each reason once, joined; "" where every condition holds."""
    reasons = _release(release) + _dispatching(plan) + _backend(plan) + _builders(facts)
    for item in plan.modules:
        keyword_only = [p.name.value for p in item.eager.params.kwonly_params]
        if keyword_only:
            reasons.append(
                f"{item.class_name} hands {', '.join(f'`{n}`' for n in keyword_only)} to its eager function by "
                "keyword, which flash attention drops"
            )
        if item.cross:
            reasons.append(
                f"{item.class_name} serves cross-attention: transformers' flash path unpads the queries with the "
                "keys' padding mask"
            )
        elif item.mask_param is not None:
            why = builders_only(causality.flow, item.class_name, item.mask_param, item.cross)
            if why is not None:
                reasons.append(f"{item.class_name}'s mask does not come as built from transformers' builders: {why}")
    return "; ".join(dict.fromkeys(reasons))


def _release(release: Release | None) -> list[str]:
    if release is None:
        return ["the target release is unknown"]
    if not release.offers_flash:
        return ["the target release offers no flash_attention_2"]
    return []


def _dispatching(plan: InterfacePlan) -> list[str]:
    if not plan.modules:
        return ["no attention class is moved onto the interface"]
    others = [*plan.flag_only, *plan.dispatching_elsewhere]
    if others:
        return [f"{', '.join(others)} already dispatched, through eager functions the port did not read"]
    return []


def _backend(plan: InterfacePlan) -> list[str]:
    """What keeps the conditions of `_supports_attention_backend` from holding, as flash attention sees it."""
    reasons = []
    if plan.threading is None or not plan.threading.complete:
        reasons.append("not every layer hands its callers' kwargs over (flash reads positions and sequence lengths)")
    if any(item.position_bias or item.folded for item in plan.modules):
        reasons.append("additive terms go as `position_bias` or in a float mask, which flash attention ignores")
    if plan.alibi is not None and plan.alibi.unknown:
        reasons.append("an ALiBi builder was not recognised")
    if plan.kept:
        reasons.append("causality rides on masks always built, and flash attention reads `is_causal` alone")
    if any(item.eager_mask_tests for item in plan.modules) or plan.eager_masks is not None:
        reasons.append("code beside the attention reads the mask in eager's form, which flash's 2-D mask is not")
    return reasons


def _builders(facts: ModuleFacts) -> list[str]:
    """The mask builder calls passing a mask function, which flash attention's 2-D mask does not apply."""
    tree = facts.tree
    found = sorted(
        {
            node.lineno
            for node in (ast.walk(tree) if tree is not None else ())
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in (CAUSAL_BUILDER, BIDIRECTIONAL_BUILDER)
            and any(k.arg in MASK_FUNCTIONS for k in node.keywords)
        }
    )
    if not found:
        return []
    lines = ", ".join(str(n) for n in found)
    return [f"the masks built at line(s) {lines} take a mask function, which flash attention's 2-D mask drops"]


__all__ = ["FLASH_FLAG", "no_flash"]
