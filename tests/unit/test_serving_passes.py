"""Interface ports as attention-interface citizens, without torch: kwargs threading, position_ids, is_causal taken
out of the kwargs, key-length checks moved into the eager function, exportable position ranges, ALiBi from 4-D
masks, and the `_supports_attention_backend` flag."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.module_facts import ModuleFacts
from sdpa_port.plan.threading import plan_threading
from sdpa_port.rewrite.layout import separated, with_star_kwargs
from sdpa_port.rewrite.thread_kwargs import thread_kwargs

from helpers import POSITION_BIAS

MODEL = textwrap.dedent(
    '''
    import torch
    from torch import nn

    from transformers.cache_utils import DynamicCache
    from transformers.masking_utils import create_causal_mask
    from transformers.modeling_utils import PreTrainedModel


    class TinyAttention(nn.Module):
        def __init__(self, config, layer_idx=None):
            super().__init__()
            self.scaling = config.hidden_size**-0.5
            self.layer_idx = layer_idx

        def forward(self, hidden_states, attention_mask=None, past_key_values=None, output_attentions=False):
            query = hidden_states[:, None]
            key = hidden_states[:, None]
            value = hidden_states[:, None]
            if past_key_values is not None:
                key, value = past_key_values.update(key, value, self.layer_idx)
            scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
            if attention_mask is not None:
                scores = scores + attention_mask
            probs = scores.softmax(dim=-1)
            output = torch.matmul(probs, value)
            return output[:, 0], probs


    class TinyLayer(nn.Module):
        def __init__(self, config, layer_idx):
            super().__init__()
            self.attn = TinyAttention(config, layer_idx)

        def forward(self, hidden_states, attention_mask=None, past_key_values=None, output_attentions=False):
            output, weights = self.attn(hidden_states, attention_mask, past_key_values, output_attentions)
            return output, weights


    class TinyPreTrainedModel(PreTrainedModel):
        base_model_prefix = "model"


    class TinyModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList([TinyLayer(config, i) for i in range(config.num_hidden_layers)])

        def forward(self, input_ids=None, attention_mask=None, past_key_values=None, inputs_embeds=None, use_cache=None):
            if inputs_embeds is None:
                inputs_embeds = self.embed(input_ids)
            if use_cache and past_key_values is None:
                past_key_values = DynamicCache(config=self.config)
            mask = create_causal_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                past_key_values=past_key_values,
            )
            hidden_states = inputs_embeds
            for layer in self.layers:
                hidden_states, _ = layer(hidden_states, mask, past_key_values)
            return hidden_states


    class TinyForCausalLM(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.model = TinyModel(config)

        def forward(self, input_ids=None, attention_mask=None, past_key_values=None, labels=None, **kwargs):
            hidden_states = self.model(input_ids, attention_mask=attention_mask, past_key_values=past_key_values)
            return self.loss_function(hidden_states, labels, **kwargs)
    '''
)


def _port(source: str) -> str:
    result = port_source(source, style="interface")
    assert result.status is Status.PORTED, (result.detail, result.reasons)
    compile(result.source, "<port>", "exec")
    return result.source


def _function(source: str, class_name: str, name: str = "forward") -> str:
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef) and inner.name == name:
                    return ast.unparse(inner)
    raise KeyError((class_name, name))


def test_kwargs_reach_the_attention_interface_from_every_model_forward() -> None:
    ported = _port(MODEL)
    attention = _function(ported, "TinyAttention")
    assert attention.startswith("def forward(self, hidden_states, attention_mask=None, past_key_values=None, output_attentions=False, **kwargs)")
    assert "position_ids=position_ids" not in attention  # the attention names no position_ids: they come in kwargs
    assert "**kwargs)" in attention.split("attention_interface(")[1]
    assert "self.attn(hidden_states, attention_mask, past_key_values, output_attentions, **kwargs)" in _function(ported, "TinyLayer")
    model = _function(ported, "TinyModel")
    assert "layer(hidden_states, mask, past_key_values, position_ids=position_ids, **kwargs)" in model
    assert "position_ids: torch.LongTensor | None=None, **kwargs" in model
    assert model.index("if position_ids is None:") < model.index("for layer in self.layers")
    lm = _function(ported, "TinyForCausalLM")
    assert "self.model(input_ids, attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)" in lm
    assert "_supports_attention_backend = True" in ported


def test_the_port_of_a_threaded_file_is_unchanged() -> None:
    ported = _port(MODEL)
    again = port_source(ported, style="interface")
    assert again.status is Status.UNCHANGED and again.source == ported


def test_a_keyword_the_kwargs_may_carry_stops_the_threading_and_the_flag() -> None:
    clashing = MODEL.replace(
        "hidden_states, _ = layer(hidden_states, mask, past_key_values)",
        "hidden_states, _ = layer(hidden_states, mask, past_key_values, output_hidden_states=True)",
    )
    result = port_source(clashing, style="interface")
    assert result.status is Status.PORTED
    assert "_supports_attention_backend" not in result.source
    line = next(i for i, text in enumerate(clashing.splitlines(), 1) if "output_hidden_states=True" in text)
    assert any(
        w.startswith(f"TinyModel.forward line {line}: passes `output_hidden_states=`") and "not set" in w
        for w in result.warnings
    ), result.warnings
    assert "output_hidden_states=True)" in _function(result.source, "TinyModel")  # that call is left as it was


def test_threading_plan_names_what_it_cannot_reach() -> None:
    source = MODEL.replace("hidden_states, _ = layer(hidden_states, mask, past_key_values)", "hidden_states = hidden_states")
    module = cst.parse_module(source)
    facts = ModuleFacts.of(module, ast.parse(source))
    plan = plan_threading(facts, {"TinyAttention"}, {"TinyAttention"})
    assert not plan.complete
    assert plan.problems == [
        "TinyForCausalLM.forward calls its layers in a way not followed here",
        "TinyModel.forward calls its layers in a way not followed here",
        "no model forward in this file is shown to call `TinyAttention`",
    ]
    unchanged, notes = thread_kwargs(module, plan)
    assert notes == [] and unchanged.code == source


@pytest.mark.parametrize(
    "before,after",
    [
        ("def f(a, b):\n    pass\n", "def f(a, b, **kwargs):\n    pass\n"),
        ("def f(\n    a,\n    b,\n):\n    pass\n", "def f(\n    a,\n    b,\n    **kwargs,\n):\n    pass\n"),
        ("def f(a, *args):\n    pass\n", "def f(a, *args, **kwargs):\n    pass\n"),
        ("def f(a, *, b=1):\n    pass\n", "def f(a, *, b=1, **kwargs):\n    pass\n"),
    ],
)
def test_star_kwargs_keep_the_layout(before: str, after: str) -> None:
    module = cst.parse_module(before)
    function = module.body[0]
    assert isinstance(function, cst.FunctionDef)
    assert module.with_changes(body=[with_star_kwargs(function, "kwargs")]).code == after


def test_separated_continues_a_one_per_line_layout() -> None:
    call = cst.parse_expression("f(\n    a,\n    b,\n)")
    assert isinstance(call, cst.Call)
    added = cst.Arg(cst.Name("c"), star="**")
    args, new = separated(list(call.args), [added])
    rebuilt = call.with_changes(args=[*args, *new])
    assert cst.Module([]).code_for_node(rebuilt) == "f(\n    a,\n    b,\n    **c,\n)"


CROSS = textwrap.dedent(
    '''
    import torch
    from torch import nn

    from transformers.masking_utils import create_causal_mask
    from transformers.modeling_utils import PreTrainedModel


    class TinyAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.num_heads = 2
            self.config = config

        def forward(self, hidden_states, key_value_states=None, attention_mask=None, **kwargs):
            bsz, tgt_len, _ = hidden_states.size()
            states = key_value_states if key_value_states is not None else hidden_states
            query_states = hidden_states.view(bsz * self.num_heads, tgt_len, -1)
            key_states = states.reshape(bsz * self.num_heads, -1, query_states.shape[-1])
            value_states = states.reshape(bsz * self.num_heads, -1, query_states.shape[-1])
            src_len = key_states.size(1)
            attn_weights = torch.bmm(query_states, key_states.transpose(1, 2))
            if attention_mask is not None:
                if attention_mask.size() != (bsz, 1, tgt_len, src_len):
                    raise ValueError("Attention mask should be of size " + str((bsz, 1, tgt_len, src_len)))
                attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + attention_mask
                attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
            attn_weights = nn.functional.softmax(attn_weights, dim=-1)
            attn_output = torch.bmm(attn_weights, value_states)
            return attn_output.view(bsz, tgt_len, -1), None


    class TinyPreTrainedModel(PreTrainedModel):
        pass


    class TinyModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.attn = TinyAttention(config)
            self.cross = TinyAttention(config)

        def forward(self, inputs_embeds, encoder_hidden_states=None, position_ids=None, past_key_values=None, **kwargs):
            mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=None, past_key_values=None)
            if position_ids is None:
                position_ids = torch.arange(
                    past_key_values_length, inputs_embeds.shape[1] + past_key_values_length, dtype=torch.long
                )
            hidden, _ = self.attn(inputs_embeds, attention_mask=mask, **kwargs)
            hidden, _ = self.cross(hidden, key_value_states=encoder_hidden_states, **kwargs)
            return hidden
    '''
)


def test_cross_attention_takes_is_causal_out_of_the_kwargs() -> None:
    attention = _function(_port(CROSS), "TinyAttention")
    assert "dispatch_is_causal = kwargs.pop('is_causal', self.is_causal) and key_value_states is None" in attention
    assert "is_causal=dispatch_is_causal" in attention


def test_key_lengths_and_their_checks_move_into_the_eager_function() -> None:
    ported = _port(CROSS)
    attention = _function(ported, "TinyAttention")
    assert "src_len" not in attention and "Attention mask should be of size" not in attention
    eager = next(ast.unparse(n) for n in ast.parse(ported).body if isinstance(n, ast.FunctionDef))
    assert "src_len = key_states.size(1)" in eager
    assert eager.index("src_len = key_states.size(1)") < eager.index("Attention mask should be of size")


def test_position_ranges_started_at_the_past_length_export() -> None:
    model = _function(_port(CROSS), "TinyModel")
    assert "position_ids = torch.arange(inputs_embeds.shape[1], dtype=torch.long) + past_key_values_length" in model


def test_a_shifted_range_keeps_the_method_called_on_it() -> None:
    source = CROSS.replace(
        "dtype=torch.long\n            )",
        "dtype=torch.long\n            ).expand(2, -1)",
    )
    assert ".expand(2, -1)" in source
    model = _function(_port(source), "TinyModel")
    assert "(torch.arange(inputs_embeds.shape[1], dtype=torch.long) + past_key_values_length).expand(2, -1)" in model


def test_a_float_range_is_not_shifted_but_reported_by_line() -> None:
    source = CROSS.replace("dtype=torch.long", "dtype=torch.float32")
    result = port_source(source, style="interface")
    model = _function(result.source, "TinyModel")
    assert "torch.arange(past_key_values_length, inputs_embeds.shape[1] + past_key_values_length" in model
    line = source.splitlines().index("            position_ids = torch.arange(") + 1
    assert any(w.startswith(f"TinyModel line {line}: a position range") for w in result.warnings), result.warnings


ALIBI = '''
def build_alibi_tensor(attention_mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """ALiBi from a 2-D padding mask."""
    batch_size, seq_length = attention_mask.shape
    slopes = torch.ones(num_heads, device=attention_mask.device)
    arange_tensor = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :]
    alibi = slopes[..., None] * arange_tensor
    return alibi.reshape(batch_size * num_heads, 1, seq_length).to(dtype)
'''


def test_alibi_from_a_2d_mask_also_takes_4d_masks_and_position_bias_withholds_the_flag() -> None:
    source = MODEL.replace("class TinyAttention(nn.Module):", ALIBI + "\n\nclass TinyAttention(nn.Module):")
    source = source.replace("def forward(self, hidden_states, attention_mask=None, past_key_values=None, output_attentions=False):\n        query", "def forward(self, hidden_states, attention_mask=None, past_key_values=None, output_attentions=False, alibi=None):\n        query")
    source = source.replace("scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling\n", "scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling + alibi\n")
    result = port_source(source, style="interface", release=POSITION_BIAS)
    assert result.status is Status.PORTED, result.reasons
    builder = next(ast.unparse(n) for n in ast.parse(result.source).body if isinstance(n, ast.FunctionDef) and n.name == "build_alibi_tensor")
    assert "if attention_mask.dim() == 4:" in builder
    assert "position_bias=" in result.source
    assert "_supports_attention_backend" not in result.source
    assert any("position_bias" in w and "silently drop" in w for w in result.warnings)


def test_position_ids_only_passed_through_are_not_built() -> None:
    """`..., position_ids = self.pad(..., position_ids)` hands on the caller's None: the model builds no positions
    (BigBird's block-size padding), so the flag is withheld and the warning says why; a fresh value builds them."""
    built = "        if position_ids is None:\n            position_ids = torch.arange(\n"
    assert CROSS.count(built) == 1
    source = CROSS.replace(
        built, "        inputs_embeds, position_ids = self.pad(inputs_embeds, position_ids)\n        if False:\n            unused = torch.arange(\n"
    )
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert any("hands position_ids on only when its caller gives them" in w for w in result.warnings), result.warnings
    assert "_supports_attention_backend" not in result.source
    assert not any("hands position_ids on only" in w for w in port_source(CROSS, filename="modeling_tiny.py").warnings)
