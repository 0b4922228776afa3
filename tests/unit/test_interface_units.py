"""Interface style (transformers 5.x) without torch: before/after pairs for its planning and rewriting steps."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from sdpa_port import Status, port_source
from sdpa_port.analyse.cstutil import code, one_per_line
from sdpa_port.rewrite.edit import rebase_config
from sdpa_port.analyse.mask_changes import extended_mask
from helpers import flat


@pytest.mark.parametrize(
    "before,to_self,after",
    [
        ("config.is_decoder", True, "self.config.is_decoder"),
        ("config.text_config.is_decoder", True, "self.config.text_config.is_decoder"),
        ("not (config.text_config.is_decoder and x.config)", True, "not (self.config.text_config.is_decoder and x.config)"),
        ("self.config.text_config.is_decoder", False, "config.text_config.is_decoder"),
        ("other.config.x", False, "other.config.x"),
    ],
)
def test_rebase_config_moves_only_the_root(before: str, to_self: bool, after: str) -> None:
    assert code(rebase_config(cst.parse_expression(before), to_self)) == after


def test_one_per_line_layout() -> None:
    call = cst.parse_expression("f(a, b=b, *c, **d)")
    assert isinstance(call, cst.Call)
    module = cst.parse_module("def g():\n    return f()\n")
    statement = module.body[0].body.body[0]  # type: ignore[attr-defined]
    laid = statement.with_changes(body=[statement.body[0].with_changes(value=one_per_line(call))])
    text = module.with_changes(body=[module.body[0].with_changes(body=module.body[0].body.with_changes(body=[laid]))]).code  # type: ignore[attr-defined]
    assert text == "def g():\n    return f(\n        a,\n        b=b,\n        *c,\n        **d,\n    )\n"


NESTED_CONFIG = textwrap.dedent(
    '''
    import torch
    from torch import nn

    from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
    from transformers.modeling_utils import PreTrainedModel


    class TinyAttention(nn.Module):
        def __init__(self, hidden_size: int, parent_config):
            super().__init__()
            self.config = parent_config
            self.scaling = hidden_size**-0.5

        def forward(self, query, key, value, attention_mask=None, **kwargs):
            scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
            if attention_mask is not None:
                scores = scores + attention_mask
            return torch.matmul(scores.softmax(dim=-1), value), None


    class TinyPreTrainedModel(PreTrainedModel):
        base_model_prefix = "model"


    class TinyModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.attention = TinyAttention(config.hidden_size, config)

        def forward(self, inputs_embeds, attention_mask=None):
            build = create_causal_mask if self.config.text_config.is_decoder else create_bidirectional_mask
            mask = build(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
            return self.attention(inputs_embeds, inputs_embeds, inputs_embeds, mask)
    '''
)


def test_a_nested_config_attribute_reaches_init_intact() -> None:
    """The module's causality follows `config.text_config.is_decoder`; `__init__` reads it from `self.config`."""
    result = port_source(NESTED_CONFIG, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "        self.is_causal = self.config.text_config.is_decoder\n" in result.source
    assert "text_self" not in result.source


def test_a_mask_concatenated_with_the_modules_own_tensor_is_found() -> None:
    """MVP's prompt keys: `torch.cat([prompt_mask, attention_mask])` is written for eager's float mask (M204)."""
    function = ast.parse(
        textwrap.dedent(
            """
            def forward(self, hidden_states, attention_mask=None, prompt=None):
                if prompt is not None and attention_mask is not None:
                    prompt_mask = torch.zeros(1, 1, 1, prompt.shape[1])
                    attention_mask = torch.cat([prompt_mask, attention_mask], dim=-1)
                causal_mask = attention_mask[:, :, :, :4]
                attention_mask = attention_mask.to(hidden_states.dtype)
            """
        )
    ).body[0]
    assert isinstance(function, ast.FunctionDef)
    assert extended_mask(function, "attention_mask") == 5
    assert extended_mask(function, "prompt") is None


PROMPT_KEYS = textwrap.dedent(
    """
    import torch
    from torch import nn

    from transformers.masking_utils import create_bidirectional_mask
    from transformers.modeling_utils import PreTrainedModel


    class TinyAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.scaling = config.head_dim**-0.5
            self.prompt = nn.Parameter(torch.zeros(1, 1, 4, config.head_dim))

        def forward(self, hidden_states, attention_mask=None, **kwargs):
            query = key = value = hidden_states[:, None]
            key = torch.cat([self.prompt.expand(key.shape[0], -1, -1, -1), key], dim=2)
            value = torch.cat([self.prompt.expand(value.shape[0], -1, -1, -1), value], dim=2)
            if attention_mask is not None:
                prompt_mask = torch.zeros(attention_mask.shape[0], 1, query.shape[2], 4)
                attention_mask = torch.cat([prompt_mask, attention_mask], dim=-1)
            scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling
            if attention_mask is not None:
                scores = scores + attention_mask
            probs = scores.softmax(dim=-1)
            return torch.matmul(probs, value)


    class TinyPreTrainedModel(PreTrainedModel):
        base_model_prefix = "model"


    class TinyModel(TinyPreTrainedModel):
        def __init__(self, config):
            super().__init__(config)
            self.attention = TinyAttention(config)

        def forward(self, inputs_embeds, attention_mask=None):
            mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
            return self.attention(inputs_embeds, mask)
    """
)
PROMPT_MASK = (
    "        if attention_mask is not None:\n"
    "            prompt_mask = torch.zeros(attention_mask.shape[0], 1, query.shape[2], 4)\n"
    "            attention_mask = torch.cat([prompt_mask, attention_mask], dim=-1)\n"
)


def test_a_mask_the_module_extends_with_zeros_gets_them_in_the_format_of_each_implementation() -> None:
    """MVP's prompt keys: the module prepends zeros (keys always kept) to eager's float mask. Under sdpa the mask is
    boolean, where True keeps: the block becomes True there, eager's path is unchanged; nothing is causal here, so
    no builder changes."""
    result = port_source(PROMPT_KEYS, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    converted = (
        "            if attention_mask.dtype == torch.bool:  # a boolean mask keeps where True: the added keys are always kept\n"
        "                prompt_mask = prompt_mask == 0\n"
        "            attention_mask = torch.cat([prompt_mask, attention_mask], dim=-1)\n"
    )
    assert converted in result.source, result.source
    assert "allow_is_causal_skip" not in result.source and "_supports_attention_backend" not in result.source
    assert any("extends its mask over keys of its own" in note for note in result.notes), result.notes


def test_causal_masks_reaching_a_module_that_extends_its_mask_are_always_built() -> None:
    """With keys of its own, sdpa's shortcut (no mask, `is_causal`) would miss them (transformers' sdpa even crops
    the keys to the query's length): the causal builder always builds its mask."""
    causal = PROMPT_KEYS.replace("create_bidirectional_mask(", "create_causal_mask(").replace(
        "attention_mask=attention_mask)\n        return", "attention_mask=attention_mask, past_key_values=None)\n        return"
    )
    assert causal != PROMPT_KEYS
    result = port_source(causal, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "past_key_values=None, allow_is_causal_skip=False)" in flat(result.source), result.source


@pytest.mark.parametrize(
    "change,why",
    [
        (  # a learned bias over the prompt keys is not "always kept": no boolean says it
            ("prompt_mask = torch.zeros(attention_mask.shape[0], 1, query.shape[2], 4)",
             "prompt_mask = self.prompt[..., 0].expand(attention_mask.shape[0], 1, query.shape[2], 4)"),
            "it is not a block of zeros bound in forward",
        ),
        (  # flash attention reads `is_causal` and a 2-D mask: it would not see the prompt keys
            ('    base_model_prefix = "model"\n', '    base_model_prefix = "model"\n    _supports_flash_attn = True\n'),
            "flash attention, already claimed",
        ),
    ],
)
def test_a_mask_extension_that_cannot_be_given_per_implementation_is_refused(change: tuple[str, str], why: str) -> None:
    source = PROMPT_KEYS.replace(*change)
    assert source != PROMPT_KEYS
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result.reasons
    assert [r.code.code for r in result.refusals] == ["M204"], result.reasons
    line = source.splitlines().index("            attention_mask = torch.cat([prompt_mask, attention_mask], dim=-1)")
    assert result.refusals[0].line == line + 1
    assert "`attention_mask` is concatenated with a tensor of the module's own" in result.reasons[0]
    assert why in result.reasons[0], result.reasons
    assert result.source == source


def test_the_same_module_without_the_concatenation_ports() -> None:
    """The control for M204: the prompt keys alone (a mask the module does not touch) port."""
    assert PROMPT_KEYS.count(PROMPT_MASK) == 1
    result = port_source(PROMPT_KEYS.replace(PROMPT_MASK, ""), filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons


def test_a_known_false_comparison_decides_its_negation_too() -> None:
    import libcst as cst

    from sdpa_port.analyse.known import Known, decide

    known = Known(falsy=frozenset({"self.a != self.b"}))
    assert decide(cst.parse_expression("self.a == self.b"), known) is True
    assert decide(cst.parse_expression("self.a != self.b"), known) is False
    assert decide(cst.parse_expression("self.a == self.c"), known) is None
    assert decide(cst.parse_expression("not self.a == self.b"), known) is False


WEIGHTS_AFTER = PROMPT_KEYS.replace(PROMPT_MASK, "").replace(
    "    def forward(self, hidden_states, attention_mask=None, **kwargs):\n",
    "    def forward(self, hidden_states, attention_mask=None, output_attentions=False, **kwargs):\n",
).replace(
    "        probs = scores.softmax(dim=-1)\n        return torch.matmul(probs, value)\n",
    "        probs = scores.softmax(dim=-1)\n"
    "        output = torch.matmul(probs, value)\n"
    "        if not output_attentions:\n"
    "            probs = None\n"
    "        return output, probs\n",
)


def test_statements_moved_after_the_product_follow_it_in_the_eager_function() -> None:
    """DETR's `if not output_attentions: attn_weights = None` after the product with V: it moves into the eager
    function after the output (refused F602 before, the output being looked for in the last statement only)."""
    assert "if not output_attentions:" in WEIGHTS_AFTER
    result = port_source(WEIGHTS_AFTER, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    eager = next(
        ast.unparse(n) for n in ast.parse(result.source).body if isinstance(n, ast.FunctionDef) and "eager" in n.name
    )
    lines = [line.strip() for line in eager.splitlines()]
    output = lines.index("attn_output = torch.matmul(probs, value)")
    assert lines[output + 1 : output + 3] == ["if not output_attentions:", "probs = None"], lines
    assert lines[-1] == "return (attn_output.transpose(1, 2).contiguous(), probs)", lines


HELPER_RETURNS_BOTH = '''
import torch
from torch import nn

from ...masking_utils import create_bidirectional_mask
from ...modeling_utils import PreTrainedModel


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def attend(self, query, key, value, attention_mask):
        scores = torch.matmul(query, key.transpose(-1, -2))
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = scores.softmax(-1)
        return torch.matmul(probs, value), probs

    def forward(self, query, key, value, attention_mask=None, output_attentions=False):
        out, probs = self.attend(query, key, value, attention_mask)
        return (out, probs) if output_attentions else (out, None)


class TinyPreTrainedModel(PreTrainedModel):
    pass
'''


def test_weights_a_statement_passes_along_are_given_by_the_dispatch() -> None:
    """A helper returning `product, probs` in one statement, inlined as `out, probs = product, probs`: the dispatch
    binds `probs` (it was left as `_`, and the statement then read a name nothing assigned)."""
    result = port_source(HELPER_RETURNS_BOTH, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    forward = result.source[result.source.index("    def forward") :]
    assert "attention_output, probs = attention_interface(" in forward, forward
    assert "out, probs = attention_output.transpose(1, 2), probs" in forward, forward


def _relative_fixture() -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parents[2] / "fixtures" / "interface_style" / "modeling_tiny_relative.py").read_text()


def test_an_inlined_helper_nothing_else_calls_is_removed() -> None:
    """The helper whose computation moved into the eager function is dead in the port: a reviewer would ask for its
    removal. One that anything else in the file still names stays."""
    source = _relative_fixture()
    result = port_source(source, filename="modeling_tiny_relative.py")
    assert result.status is Status.PORTED, result.reasons
    assert "def attend(" in source and "def attend(" not in result.source
    assert any("attend moved into the eager function, removed" in note for note in result.notes), result.notes

    kept = source.replace(
        "    def forward(self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False):\n"
        "        batch, length, width",
        "    def weights_of(self, query, key, value):\n"
        "        return self.attend(query, key, value, None, 0.0)[1]\n\n"
        "    def forward(self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False):\n"
        "        batch, length, width",
        1,
    )
    assert kept != source
    result = port_source(kept, filename="modeling_tiny_relative.py")
    assert result.status is Status.PORTED, result.reasons
    assert "def attend(" in result.source


def test_scores_returned_for_a_request_for_weights_are_refused_in_the_interface_style() -> None:
    """The class style falls back to eager when weights are asked for; the interface's eager function holds only the
    chain, so scores kept under `if output_attentions:` would be lost: refused W403."""
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / "fixtures" / "interface_style" / "modeling_tiny_lengthfirst.py").read_text()
    kept = "        if output_attentions:\n            returned = scores\n        else:\n            returned = None\n"
    changed = source.replace("        probs = nn.functional.softmax(scores, dim=-1)\n", kept + "        probs = nn.functional.softmax(scores, dim=-1)\n")
    changed = changed.replace("return (output, probs) if output_attentions else (output, None)", "return output, returned")
    assert changed.count("returned = ") == 2 and "return output, returned" in changed
    result = port_source(changed, filename="modeling_tiny_lengthfirst.py")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == ["W403"], result.reasons


def _two_helpers(test: str) -> str:
    """ImageGPT's form on the relative-position fixture: `attend` beside an upcast copy `attend_upcast`, the call
    chosen by `test`."""
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / "fixtures" / "interface_style" / "modeling_tiny_relative.py").read_text()
    helper = source.split("    def attend(")[1].split("    def forward(")[0]
    upcast = "    def attend_upcast(" + helper.replace("scores = scores + position_bias", "scores = scores.float() + position_bias")
    changed = source.replace("    def forward(self, hidden_states, attention_mask=None, position_bias=None", upcast + "    def forward(self, hidden_states, attention_mask=None, position_bias=None", 1)
    changed = changed.replace(
        "        output, weights = self.attend(query, key, value, attention_mask, position_bias)\n",
        f"        if {test}:\n"
        "            output, weights = self.attend_upcast(query, key, value, attention_mask, position_bias)\n"
        "        else:\n"
        "            output, weights = self.attend(query, key, value, attention_mask, position_bias)\n",
    )
    assert "attend_upcast(query" in changed and "def attend_upcast(" in changed
    return changed


# the kept code's first lines, inside its branch: the mask in eager's form
EAGER_FORM = (
    "            if attention_mask is not None and attention_mask.dtype == torch.bool:\n"
    "                # this code computes eagerly: it takes the mask in eager's form (transformers built it for the "
    "implementation in use)\n"
    "                attention_mask = torch.zeros_like(attention_mask, dtype=hidden_states.dtype).masked_fill(\n"
    "                    ~attention_mask, torch.finfo(hidden_states.dtype).min\n"
    "                )\n"
)
TWO_HELPERS_KEPT = (
    "        if self.config.upcast:\n"
    + EAGER_FORM
    + "            output, weights = self.attend_upcast(query, key, value, attention_mask, position_bias)\n"
    "        else:\n"
)


def test_attention_in_two_helpers_chosen_by_a_setting_dispatches_the_side_the_setting_leaves_off() -> None:
    """ImageGPT's `_attn` beside its upcast `_upcast_and_reordered_attn`, chosen by a setting (refused S109 before):
    the helper called where the setting is false dispatches; the other side runs as written under every
    implementation, its helper kept as a method, and takes the bidirectional builder's mask in eager's form."""
    result = port_source(_two_helpers("self.config.upcast"), filename="modeling_tiny_relative.py")
    assert result.status is Status.PORTED, result.reasons
    assert TWO_HELPERS_KEPT in result.source, result.source
    forward = result.source[result.source.index(TWO_HELPERS_KEPT) :]
    assert "attention_interface(" in forward
    assert "    def attend_upcast(" in result.source and "    def attend(" not in result.source
    assert "_supports_attention_backend" not in result.source
    assert any("under `if self.config.upcast:` stays eager" in w for w in result.warnings), result.warnings


def test_attention_in_two_helpers_under_a_negated_setting_dispatches_where_the_setting_is_off() -> None:
    """`if not self.config.plain:` takes its first branch where the setting is off: that helper dispatches, and the
    `else` side runs as written."""
    result = port_source(_two_helpers("not self.config.plain"), filename="modeling_tiny_relative.py")
    assert result.status is Status.PORTED, result.reasons
    forward = result.source[result.source.index("        if not self.config.plain:\n") :]
    assert "attention_interface(" in forward[: forward.index("        else:\n")]
    kept = forward[forward.index("        else:\n") :]
    assert kept.startswith(
        "        else:\n            if attention_mask is not None and attention_mask.dtype == torch.bool:\n"
    ), kept[:300]
    assert "            output, weights = self.attend(query, key, value, attention_mask, position_bias)\n" in kept
    assert "    def attend(" in result.source and "    def attend_upcast(" not in result.source


@pytest.mark.parametrize(
    "test,after,code,why",
    [
        # an argument of the call chooses: no setting to fall back on, and no proof the two are one computation
        ("upcast", "", "S109", "no test of the module's settings chooses between them"),
        # the setting decides more than the choice of helper: code the trace never saw
        (
            "self.config.upcast",
            "        if self.config.upcast:\n            output = output * 2\n",
            "W403",
            "no branch of an `if` testing it holds the whole attention",
        ),
    ],
)
def test_attention_in_two_helpers_without_one_setting_choosing_is_refused(test: str, after: str, code: str, why: str) -> None:
    source = _two_helpers(test)
    if test == "upcast":
        source = source.replace(
            "    def forward(self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False):\n        batch",
            "    def forward(self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False, upcast=False):\n        batch",
        )
        assert "upcast=False" in source
    if after:
        marker = "            output, weights = self.attend(query, key, value, attention_mask, position_bias)\n"
        source = source.replace(marker, marker + after, 1)
        assert after in source
    result = port_source(source, filename="modeling_tiny_relative.py")
    assert result.status is Status.REFUSED and [r.code.code for r in result.refusals] == [code], result.reasons
    assert why in result.reasons[0], result.reasons


APPROXIMATION = PROMPT_KEYS.replace(PROMPT_MASK, "").replace(
    "        self.prompt = nn.Parameter(torch.zeros(1, 1, 4, config.head_dim))\n",
    "        self.prompt = nn.Parameter(torch.zeros(1, 1, 4, config.head_dim))\n"
    "        self.landmarks = config.landmarks\n"
    "        self.seq_len = config.seq_len\n",
).replace(
    "        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling\n"
    "        if attention_mask is not None:\n"
    "            scores = scores + attention_mask\n"
    "        probs = scores.softmax(dim=-1)\n"
    "        return torch.matmul(probs, value)\n",
    "        if self.landmarks == self.seq_len:\n"
    "            scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling\n"
    "            if attention_mask is not None:\n"
    "                scores = scores + attention_mask\n"
    "            probs = scores.softmax(dim=-1)\n"
    "            output = torch.matmul(probs, value)\n"
    "        else:\n"
    "            landmarks = key.reshape(key.shape[0], 1, self.landmarks, -1, key.shape[-1]).mean(dim=-2)\n"
    "            scores = torch.matmul(landmarks, key.transpose(-1, -2))\n"
    "            if attention_mask is not None:\n"
    "                scores = scores + attention_mask\n"
    "            kernel = scores.softmax(dim=-1)\n"
    "            output = torch.matmul(torch.matmul(query, landmarks.transpose(-1, -2)).softmax(dim=-1), kernel @ value)\n"
    "        return output\n",
)
APPROXIMATION_CONVERTED = (
    "        else:\n"
    + EAGER_FORM
    + "            landmarks = key.reshape("
)


def test_an_approximation_beside_the_attention_stays_eager_with_eager_s_mask() -> None:
    """Nystromformer's form: the side computing the attention dispatches, the approximation runs as written, and
    the bidirectional builder's mask it reads is rebuilt in eager's form from sdpa's booleans."""
    result = port_source(APPROXIMATION, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.refusals
    forward = result.source[result.source.index("class TinyAttention") :]
    assert "attention_interface(" in forward[: forward.index("        else:\n")]
    assert APPROXIMATION_CONVERTED in forward
    assert "_supports_attention_backend" not in result.source
    eager = result.source[result.source.index("def eager_attention_forward") : result.source.index("class TinyAttention")]
    assert "landmarks" not in eager


@pytest.mark.parametrize(
    "change,why",
    [
        # a mask the model makes itself, not a builder's: what each implementation gets is not known
        (
            (
                "mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)",
                "mask = (1.0 - attention_mask[:, None, None, :]) * -10000.0",
            ),
            "eager's cannot be rebuilt from it",
        ),
        # forward changes the mask first: what it holds is no builder's mask any more
        (
            ("        if self.landmarks == self.seq_len:\n", "        attention_mask = attention_mask * 2\n        if self.landmarks == self.seq_len:\n"),
            "forward assigns `attention_mask`",
        ),
        # a module no call is followed to: the masks it receives are not known
        (
            ("        return self.attention(inputs_embeds, mask)\n", "        return mask\n"),
            "`TinyModel.attention` (line 45): it is never called in this file",
        ),
        # a construction outside a module attribute
        (
            ("        self.attention = TinyAttention(config)\n", "        self.attention = TinyAttention(config)\n        spare = TinyAttention(config)\n"),
            "`TinyAttention` is built at line 46 outside a module attribute",
        ),
    ],
)
def test_an_approximation_reading_a_mask_without_an_eager_form_is_refused(change: tuple[str, str], why: str) -> None:
    source = APPROXIMATION.replace(*change)
    assert source != APPROXIMATION
    result = port_source(source.replace("from transformers.masking_utils import create_bidirectional_mask", "from transformers.masking_utils import create_bidirectional_mask, create_causal_mask"), filename="modeling_tiny.py")
    assert result.status is Status.REFUSED
    assert why in result.refusals[0].detail, result.refusals[0].detail


@pytest.mark.parametrize("test", ["not self.config.approximate", "self.config.exact"])
def test_an_approximation_chosen_by_a_flag_stays_eager_beside_the_dispatch(test: str) -> None:
    """The exact side chosen by a flag of the module's settings rather than a comparison (refused S109 before, as
    two attentions), in its first branch whether the flag is off there (`not self.x`) or on (`self.x`)."""
    source = APPROXIMATION.replace("        if self.landmarks == self.seq_len:\n", f"        if {test}:\n")
    assert source != APPROXIMATION
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    forward = result.source[result.source.index(f"        if {test}:\n") :]
    assert "attention_interface(" in forward[: forward.index("        else:\n")]
    assert APPROXIMATION_CONVERTED in forward


BUILDER_BY_SETTING = (
    "        if self.config.is_decoder:\n"
    "            mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask, past_key_values=None)\n"
    "        else:\n"
    "            mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)\n"
)


def test_an_approximation_takes_eager_s_form_of_a_causal_mask_the_port_always_builds() -> None:
    """ImageGPT's builders: causal or bidirectional by a setting, so the module's causality stays in its masks and
    the port makes the causal builder always build (`allow_is_causal_skip=False`). Under sdpa that mask is then
    always booleans, never None, and the code kept eager beside the dispatch can take it in eager's form."""
    source = APPROXIMATION.replace(
        "from transformers.masking_utils import create_bidirectional_mask",
        "from transformers.masking_utils import create_bidirectional_mask, create_causal_mask",
    ).replace(
        "        mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)\n",
        BUILDER_BY_SETTING,
    )
    assert "create_causal_mask(config" in source, source
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert APPROXIMATION_CONVERTED in result.source
    assert result.source.count("allow_is_causal_skip=False") == 1, result.source


def test_an_approximation_reading_a_causal_builder_s_mask_has_it_always_built() -> None:
    """Only causal masks reach the module (`is_causal=True`): sdpa's builder may leave the causality to `is_causal`
    with no mask, where eager's builds one. The code kept eager beside the dispatch reads the mask, so the causal
    builder is made to build it under every implementation, and eager's form follows from sdpa's booleans."""
    source = APPROXIMATION.replace("create_bidirectional_mask", "create_causal_mask")
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert APPROXIMATION_CONVERTED in result.source
    assert result.source.count("allow_is_causal_skip=False") == 1, result.source
    assert "self.is_causal = True" in result.source
    assert any("reads the mask in eager's form" in note for note in result.notes), result.notes


def test_without_code_beside_reading_the_mask_the_causal_builder_may_skip() -> None:
    source = APPROXIMATION.replace("create_bidirectional_mask", "create_causal_mask").replace(
        "            if attention_mask is not None:\n                scores = scores + attention_mask\n            kernel",
        "            kernel",
    )
    assert "            kernel" in source and source.count("scores = scores + attention_mask") == 1
    result = port_source(source, filename="modeling_tiny.py")
    assert result.status is Status.PORTED, result.reasons
    assert "allow_is_causal_skip" not in result.source


def test_an_alternative_that_reads_the_scores_computed_before_it_is_refused() -> None:
    """When the product precedes the `if`, the approximation's side reads the scores the dispatch no longer computes:
    no branch holds the whole attention, and the interface cannot fall back to eager for it."""
    shared = APPROXIMATION.replace(
        "        if self.landmarks == self.seq_len:\n            scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling\n",
        "        scores = torch.matmul(query, key.transpose(-1, -2)) * self.scaling\n        if self.landmarks == self.seq_len:\n",
    ).replace("            scores = torch.matmul(landmarks, key.transpose(-1, -2))\n", "            scores = scores[:, :, : self.landmarks]\n")
    assert shared != APPROXIMATION and "self.landmarks = config.landmarks" in shared
    result = port_source(shared, filename="modeling_tiny.py")
    assert result.status is Status.REFUSED, result.source
    assert result.refusals[0].code.value[0] == "W403", result.refusals
