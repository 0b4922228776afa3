"""The target release as a fact: read from its sources (synthetic ones here, of both kinds), and what a port hands
the implementations or claims in it: additive terms as `position_bias` or folded into the mask, cache updates
with the kwargs, `_supports_attention_backend` only where continuous batching's paged cache can reach the model."""

from __future__ import annotations

import ast
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from sdpa_port import Status, port_source
from sdpa_port.discover import release as release_module
from sdpa_port.discover.release import FLEX, INIT, PAGED_CACHE, SDPA, read_release, release_facts, target_release

from helpers import MODEL_UPDATES, POSITION_BIAS
from test_serving_passes import MODEL

# ------------------------------------------------------------------ the release's sources, both kinds

SDPA_WITHOUT = '''
def sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask)
'''
SDPA_WITH = '''
def sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           position_bias=None, cache=None, **kwargs):
    if isinstance(cache, PagedAttentionCache):
        key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
    if position_bias is not None:
        attention_mask = create_position_bias_mask(position_bias, attention_mask, is_causal, query, key)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask)
'''
FLEX_WITHOUT = '''
def flex_attention_forward(module, query, key, value, attention_mask, scaling=None, softcap=None, **kwargs):
    def score_mod(score, batch_idx, head_idx, q_idx, kv_idx):
        return score
'''
FLEX_FROM_KWARGS = '''
def flex_attention_forward(module, query, key, value, attention_mask, scaling=None, **kwargs):
    position_bias = kwargs.get("position_bias")
'''
PAGED_OLD = '''
class PagedAttentionCache:
    def __init__(self, config):
        self.config = config

    def update(self, key_states, value_states, layer_idx, read_index, write_index):
        return key_states, value_states
'''
PAGED_NEW = '''
class PagedAttentionCache:
    def update(self, key_states, value_states, layer_idx, kwargs):
        return key_states, value_states

    def free_blocks(self, request_id):
        pass
'''


def test_a_release_before_position_bias_is_read_as_such() -> None:
    facts = release_facts(
        {INIT: '__version__ = "5.10.4"\n', SDPA: SDPA_WITHOUT, FLEX: FLEX_WITHOUT, PAGED_CACHE: PAGED_OLD,
         "integrations/sdpa_paged.py": "def paged(module, q, k, v, mask, cache=None, **kwargs):\n"
                                       "    k, v = cache.update(k, v, module.layer_idx, **kwargs)\n"}
    )
    assert facts.version == "5.10.4"
    assert not facts.sdpa_position_bias and not facts.flex_position_bias
    assert not facts.model_updates_paged_cache  # sdpa_paged updates the cache it is handed
    assert facts.paged_update_parameters == ("read_index", "write_index")
    assert facts.paged_cache_methods == {"__init__", "update"}


def test_a_release_whose_sdpa_reads_position_bias_and_whose_models_update_the_paged_cache() -> None:
    facts = release_facts({INIT: '__version__ = "5.25.0"\n', SDPA: SDPA_WITHOUT.replace("**kwargs):", "position_bias=None, **kwargs):\n    attention_mask = position_bias"), FLEX: FLEX_FROM_KWARGS, PAGED_CACHE: PAGED_NEW})
    assert facts.sdpa_position_bias and facts.flex_position_bias
    assert facts.model_updates_paged_cache
    assert facts.paged_update_parameters == ("kwargs",)
    assert "get_seq_length" not in facts.paged_cache_methods


def test_an_implementation_updating_the_paged_cache_leaves_nothing_to_the_model() -> None:
    facts = release_facts({SDPA: SDPA_WITH, PAGED_CACHE: PAGED_NEW})
    assert facts.sdpa_position_bias and not facts.model_updates_paged_cache
    assert facts.version is None


@pytest.mark.parametrize(
    "source",
    [
        SDPA_WITHOUT.replace("**kwargs):", "position_bias=None, **kwargs):"),  # taken, never read
        SDPA_WITHOUT.replace("attn_mask=attention_mask", "attn_mask=kwargs.get('bias')"),
        "def other_forward(module, query, key, value, position_bias=None):\n    return position_bias\n",
        "def sdpa_attention_forward(:\n",  # not Python
    ],
)
def test_position_bias_is_read_only_where_the_function_reads_it(source: str) -> None:
    assert not release_facts({SDPA: source}).sdpa_position_bias


def test_a_package_folder_is_read_and_found_around_its_files(tmp_path: Path) -> None:
    package = tmp_path / "site" / "transformers"
    (package / "integrations").mkdir(parents=True)
    (package / "models" / "t5").mkdir(parents=True)
    (package / INIT).write_text('__version__ = "5.10.4"\n')
    (package / SDPA).write_text(SDPA_WITHOUT)
    modeling = package / "models" / "t5" / "modeling_t5.py"
    modeling.write_text("import torch\n")
    assert read_release(package).version == "5.10.4"
    found = target_release(modeling)
    assert found is not None and found.version == "5.10.4" and not found.sdpa_position_bias


def test_a_file_outside_any_package_takes_the_installed_one_else_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = tmp_path / "modeling_remote.py"
    alone.write_text("import torch\n")
    monkeypatch.setattr(release_module, "installed_package", lambda: None)
    assert target_release(alone) is None
    package = tmp_path / "installed" / "transformers"
    (package / "integrations").mkdir(parents=True)
    (package / INIT).write_text('__version__ = "5.23.0"\n')
    (package / SDPA).write_text(SDPA_WITH)
    monkeypatch.setattr(release_module, "installed_package", lambda: package)
    found = target_release(alone)
    assert found is not None and found.version == "5.23.0" and found.sdpa_position_bias


# ------------------------------------------------------------------ additive terms: position_bias or folded

RELATIVE = MODEL.replace(
    "def forward(self, hidden_states, attention_mask=None, past_key_values=None, output_attentions=False):\n"
    "        query",
    "def forward(self, hidden_states, attention_mask=None, past_key_values=None, output_attentions=False, "
    "position_bias=None):\n        query",
).replace(
    "scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling\n",
    "scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling + position_bias\n",
)
BEFORE_POSITION_BIAS = replace(POSITION_BIAS, version="5.10.4", sdpa_position_bias=False, flex_position_bias=False)


def _forward(source: str, class_name: str) -> str:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return ast.unparse(next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "forward"))
    raise KeyError(class_name)


def _function(source: str, name: str) -> str:
    return ast.unparse(next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name))


def test_a_release_whose_sdpa_reads_position_bias_gets_the_terms_so() -> None:
    assert "+ position_bias" in RELATIVE and "output_attentions=False, position_bias=None)" in RELATIVE
    result = port_source(RELATIVE, style="interface", release=POSITION_BIAS)
    assert result.status is Status.PORTED, result.reasons
    forward = _forward(result.source, "TinyAttention")
    dispatch = forward.split("attention_interface(")[1]
    assert "position_bias=dispatch_bias" in dispatch and "dispatch_bias = position_bias" in forward
    assert "fold_additive_terms" not in result.source
    assert "attention_mask = attention_mask" not in result.source  # eager reads the mask it is handed


def test_flex_gets_the_terms_expanded_to_the_scores_shape() -> None:
    """Transformers' flex indexes `position_bias[batch, head, query, key]` with no broadcasting, so terms of shape
    `(1, heads, q, k)` or `(batch, heads, 1, k)` fail inside the compiled kernel: under flex (only, since sdpa would
    copy an expansion) they are handed over expanded, a view; a term that may be None is left as it is."""
    result = port_source(RELATIVE, style="interface", release=POSITION_BIAS)
    forward = _forward(result.source, "TinyAttention")
    before_dispatch = forward.split("attention_interface(")[-2]
    assert "dispatch_bias = position_bias" in before_dispatch
    assert (
        "if self.config._attn_implementation == 'flex_attention' and dispatch_bias is not None:\n"
        "        dispatch_bias = dispatch_bias.expand(*query.shape[:-1], key.shape[-2])"
    ) in before_dispatch


@pytest.mark.parametrize("release", [None, BEFORE_POSITION_BIAS], ids=["unknown", "5.10.4"])
def test_elsewhere_the_terms_are_folded_into_the_mask_and_eager_takes_its_own(release: object) -> None:
    result = port_source(RELATIVE, style="interface", release=release)  # type: ignore[arg-type]
    assert result.status is Status.PORTED, result.reasons
    dispatch = _forward(result.source, "TinyAttention").split("attention_interface(")[1]
    # positionally: the terms folded with the mask as built, and sdpa's causality (the caller's, else the module's)
    # (the mask as transformers built it, converted for eager where weights are asked for: `dispatch_mask`)
    assert "fold_additive_terms(position_bias, dispatch_mask, kwargs.get('is_causal', self.is_causal), query, key)" in dispatch
    assert "position_bias=" not in dispatch.replace("position_bias_=", "")
    assert "attention_mask_=dispatch_mask" in dispatch  # the eager function's own mask, by keyword
    eager = _function(result.source, "eager_attention_forward")
    assert "attention_mask_" in eager.split("):")[0] and "scores + attention_mask_" in eager
    fold = _function(result.source, "fold_additive_terms")
    assert "torch.where(attention_mask, terms, torch.finfo(terms.dtype).min)" in fold
    assert "return terms + attention_mask" in fold
    assert result.source.index("def fold_additive_terms") < result.source.index("def eager_attention_forward")
    assert "_supports_attention_backend" not in result.source
    assert any("folds its additive terms" in w and "not set" in w for w in result.warnings), result.warnings
    again = port_source(result.source, style="interface", release=release)  # type: ignore[arg-type]
    assert again.status is Status.UNCHANGED and again.source == result.source


def test_terms_without_a_mask_are_folded_with_the_causality_sdpa_would_apply() -> None:
    """A module that takes no mask (T5 adds its mask to its position bias itself): the terms are folded with None,
    and with the `is_causal` a caller may pass (sdpa sees a mask, so the fold applies the causality)."""
    source = RELATIVE.replace("        if attention_mask is not None:\n            scores = scores + attention_mask\n", "")
    assert "scores + attention_mask" not in source
    result = port_source(source, style="interface", release=BEFORE_POSITION_BIAS)
    assert result.status is Status.PORTED, result.reasons
    dispatch = _forward(result.source, "TinyAttention").split("attention_interface(")[1]
    assert "fold_additive_terms(position_bias, None, kwargs.get('is_causal', self.is_causal), query, key)" in dispatch
    assert "attention_mask_=" not in dispatch  # the eager function reads no mask


def test_a_port_without_terms_is_the_same_in_every_release() -> None:
    ported = {r: port_source(MODEL, style="interface", release=r).source for r in (None, BEFORE_POSITION_BIAS, POSITION_BIAS)}
    assert len(set(ported.values())) == 1


# ------------------------------------------------------------------ the paged cache, left to the model (5.25.0)

CACHE_NAMED = MODEL.replace("past_key_values", "cache")


def test_cache_updates_take_the_kwargs_where_the_model_updates_the_paged_cache() -> None:
    result = port_source(CACHE_NAMED, style="interface", release=MODEL_UPDATES)
    assert result.status is Status.PORTED, result.reasons
    attention = _forward(result.source, "TinyAttention")
    assert "cache.update(key, value, self.layer_idx, kwargs=kwargs)" in attention
    assert attention.index("kwargs=kwargs)") < attention.index("attention_interface(")
    model = _forward(result.source, "TinyModel")
    assert "past_seen_tokens = cache.get_seq_length() if cache is not None else 0" in model  # llama's default
    assert "_supports_attention_backend = True" in result.source
    # where the implementations update it, the calls are left as they are
    elsewhere = port_source(CACHE_NAMED, style="interface", release=POSITION_BIAS)
    assert "cache.update(key, value, self.layer_idx)\n" in elsewhere.source


def test_a_method_the_paged_cache_lacks_on_continuous_batching_s_path_withholds_the_flag() -> None:
    unguarded = CACHE_NAMED.replace(
        "        hidden_states = inputs_embeds\n",
        "        past_length = cache.get_seq_length() if cache is not None else 0\n"
        "        hidden_states = inputs_embeds\n",
    )
    result = port_source(unguarded, style="interface", release=MODEL_UPDATES)
    line = next(i for i, text in enumerate(unguarded.splitlines(), 1) if "past_length = cache" in text)
    assert "_supports_attention_backend" not in result.source
    assert any(w.startswith(f"TinyModel.forward line {line} calls `cache.get_seq_length()`") for w in result.warnings), result.warnings
    # under `if position_ids is None:`, as llama reads it, it is off the path (continuous batching gives positions)
    guarded = CACHE_NAMED.replace(
        "def forward(self, input_ids=None, attention_mask=None, cache=None, inputs_embeds=None, use_cache=None):",
        "def forward(self, input_ids=None, attention_mask=None, cache=None, inputs_embeds=None, use_cache=None, position_ids=None):",
    ).replace(
        "        hidden_states = inputs_embeds\n",
        "        if position_ids is None:\n"
        "            position_ids = torch.arange(inputs_embeds.shape[1])[None] + cache.get_seq_length()\n"
        "        hidden_states = inputs_embeds\n",
    )
    assert "position_ids is None" in guarded
    flagged = port_source(guarded, style="interface", release=MODEL_UPDATES)
    assert "_supports_attention_backend = True" in flagged.source, flagged.warnings
    # and where the implementations update the paged cache, it never reaches the model's own cache
    assert "_supports_attention_backend = True" in port_source(unguarded, style="interface", release=POSITION_BIAS).source


def test_a_model_taking_its_cache_by_another_name_never_sees_the_paged_cache() -> None:
    result = port_source(MODEL, style="interface", release=MODEL_UPDATES)
    assert "_supports_attention_backend" not in result.source
    assert any("takes its cache as `past_key_values`" in w for w in result.warnings), result.warnings


def test_an_update_between_model_and_attention_without_the_kwargs_withholds_the_flag() -> None:
    source = CACHE_NAMED.replace(
        "        output, weights = self.attn(hidden_states, attention_mask, cache, output_attentions)\n",
        "        if cache is not None:\n"
        "            cache.update(hidden_states, hidden_states, 0)\n"
        "        output, weights = self.attn(hidden_states, attention_mask, cache, output_attentions)\n",
    )
    assert source != CACHE_NAMED
    result = port_source(source, style="interface", release=MODEL_UPDATES)
    assert "_supports_attention_backend" not in result.source
    assert any("TinyLayer.forward line" in w and "updates the cache without its kwargs" in w for w in result.warnings)


def test_the_fold_function_reads_as_python() -> None:
    result = port_source(RELATIVE, style="interface")
    fold = _function(result.source, "fold_additive_terms")
    compile(textwrap.dedent(fold), "<fold>", "exec")
    assert fold.count("torch.where(") == 2


def test_a_wheel_tree_carries_its_release_for_the_files_in_it(tmp_path: Path) -> None:
    """The corpus ports a wheel's files in a tree extracted from it: the release's sources come along, so each file
    is ported for its own release."""
    import zipfile

    from sdpa_port.edge.wheels import copy_tree, extract_tree, wheel_path

    wheel = wheel_path(tmp_path, "5.10.4")
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("transformers/__init__.py", '__version__ = "5.10.4"\n')
        archive.writestr("transformers/" + SDPA, SDPA_WITHOUT)
        archive.writestr("transformers/activations.py", "")  # no source of the release's facts
        archive.writestr("transformers/models/t5/modeling_t5.py", "import torch\n")
    tree = copy_tree(extract_tree(wheel, tmp_path / "trees"), tmp_path / "copy")
    assert not (tree / "transformers" / "activations.py").exists()
    found = target_release(tree / "transformers" / "models" / "t5" / "modeling_t5.py")
    assert found is not None and found.version == "5.10.4" and not found.sdpa_position_bias


def test_a_file_claiming_flex_is_refused_only_where_the_terms_must_ride_on_the_mask() -> None:
    from test_refusal_docs import source_of

    source = source_of("M205")
    assert "_supports_flex_attn = True" in source
    folded = port_source(source, style="interface", release=BEFORE_POSITION_BIAS)
    assert folded.status is Status.REFUSED and {r.code.code for r in folded.refusals} == {"M205"}
    handed = port_source(source, style="interface", release=POSITION_BIAS)
    assert handed.status is Status.PORTED, handed.reasons
