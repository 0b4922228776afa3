"""Which config changes the verifier runs the checks under: flags and list members that switch score terms on."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

from sdpa_port.verify.terms import setting_values, term_trials

ORIGINAL = '''
class Attention:
    def __init__(self, config):
        self.relative_attention = getattr(config, "relative_attention", False)
        self.kinds = config.term_kinds if config.term_kinds is not None else []
        self.window = config.use_window

    def forward(self, scores):
        if self.relative_attention and "c2p" in self.kinds:
            scores = scores + 1
        if "p2c" in self.kinds:
            scores = scores + 2
        return scores
'''

PORTED = ORIGINAL + '''

class SdpaAttention(Attention):
    def forward(self, scores):
        return scaled_dot_product_attention(scores)
'''


def _module(tmp_path: Path, name: str, source: str) -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_getattr_flags_and_membership_lists_are_switched_on(tmp_path: Path) -> None:
    ported = _module(tmp_path, "terms_ported", PORTED)
    config = SimpleNamespace(relative_attention=False, term_kinds=None, use_window=False)
    trials = term_trials([ported.SdpaAttention], config)
    assert trials == [
        ("relative_attention=True", {"relative_attention": True}),
        ("use_window=True", {"use_window": True}),
        (
            "relative_attention=True, use_window=True, term_kinds=['c2p', 'p2c']",
            {"relative_attention": True, "use_window": True, "term_kinds": ["c2p", "p2c"]},
        ),
    ]


def test_lists_already_filled_are_left_alone(tmp_path: Path) -> None:
    ported = _module(tmp_path, "terms_ported2", PORTED)
    config = SimpleNamespace(relative_attention=True, term_kinds=["c2p"], use_window=True)
    assert term_trials([ported.SdpaAttention], config) == []


SETTINGS = '''
class Attention:
    def __init__(self, config):
        self.position_embeddings_type = config.position_embeddings_type
        self.norm = config.norm

    def forward(self, scores):
        if self.position_embeddings_type == "rotary":
            scores = scores + 1
        if self.position_embeddings_type != "relative" and self.norm == "pre":
            scores = scores + 2
        return scores


class SdpaAttention(Attention):
    def forward(self, scores):
        if self.position_embeddings_type == "relative_key":
            return super().forward(scores)
        return scaled_dot_product_attention(scores)
'''


def test_string_settings_offer_the_other_literals_compared_then_none(tmp_path: Path) -> None:
    """An SDPA class that falls back to eager at the config's setting is reached under another: the other literals
    the attention compares the setting with, then None; a setting already at the only literal it is compared with offers nothing."""
    ported = _module(tmp_path, "settings_ported", SETTINGS)
    config = SimpleNamespace(position_embeddings_type="relative_key", norm="pre")
    assert setting_values([ported.SdpaAttention], config) == {
        "position_embeddings_type": ["relative", "rotary", None]
    }
    assert setting_values([ported.SdpaAttention], SimpleNamespace(position_embeddings_type=None, norm=None)) == {}


PROMPTED = '''
class Attention:
    def __init__(self, config):
        self.scale = config.scale

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, attn_prompt=None, output_attentions=False):
        if attn_prompt is not None:
            hidden_states = hidden_states + attn_prompt
        return hidden_states
'''


def test_a_switch_named_after_an_optional_input_of_the_attention_is_turned_on(tmp_path: Path) -> None:
    """MVP hands its attention `attn_prompt` only when `config.use_prompt` is on: the checks run with it on too.
    Switches named after the usual inputs (`use_cache` for `past_key_values`) or after nothing the attention takes
    are not."""
    module = _module(tmp_path, "terms_prompted", PROMPTED)
    config = SimpleNamespace(use_prompt=False, use_cache=False, add_cross_attention=False, output_hidden_states=False, scale=1)
    assert term_trials([module.Attention], config) == [("use_prompt=True", {"use_prompt": True})]
    switched = SimpleNamespace(**{**vars(config), "use_prompt": True})
    assert term_trials([module.Attention], switched) == []


KEPT_SIDE = '''
ALL_ATTENTION_FUNCTIONS = {}


class Attention:
    def __init__(self, config):
        self.upcast = config.reorder_and_upcast_attn
        self.window = config.use_window

    def forward(self, hidden_states):
        if self.upcast:
            output = self.upcast_attention(hidden_states)
        else:
            attention_interface = ALL_ATTENTION_FUNCTIONS.get("sdpa")
            output = attention_interface(hidden_states)
        if self.window:
            output = output + 1
        return output
'''


@dataclass(frozen=True)
class Check:  # the fields of the verifier's `Check`, whose module needs torch
    name: str
    passed: bool
    max_diff: float | None = None
    detail: str = ""
    skipped: bool = False


def test_a_setting_that_sends_forward_to_the_side_kept_eager_expects_no_sdpa(tmp_path: Path) -> None:
    """ImageGPT's port keeps its upcast helper under `if self.reorder_and_upcast_attn:` as written: under that
    setting no SDPA call is expected, and a failed "sdpa executed" check says so and passes; the other checks and
    other settings (one deciding no branch with a dispatch, the default) stay as they are."""
    from sdpa_port.verify.terms import eager_sides, expected_on_eager

    module = _module(tmp_path, "terms_kept", KEPT_SIDE)
    assert eager_sides([module.Attention], {"reorder_and_upcast_attn": True}) == ["self.upcast"]
    assert eager_sides([module.Attention], {"reorder_and_upcast_attn": False}) == []
    assert eager_sides([module.Attention], {"use_window": True}) == []
    negated = _module(tmp_path, "terms_kept_not", KEPT_SIDE.replace("if self.upcast:", "if not self.upcast:"))
    assert eager_sides([negated.Attention], {"reorder_and_upcast_attn": True}) == []
    assert eager_sides([negated.Attention], {"reorder_and_upcast_attn": False}) == ["self.upcast"]
    # the setting read through the module's config
    configured = _module(tmp_path, "terms_kept_config", KEPT_SIDE.replace("if self.upcast:", "if self.config.reorder_and_upcast_attn:"))
    assert eager_sides([configured.Attention], {"reorder_and_upcast_attn": True}) == ["self.config.reorder_and_upcast_attn"]
    assert eager_sides([configured.Attention], {"reorder_and_upcast_attn": False}) == []
    checks = [
        Check("M[right] sdpa == eager", False, 1.0),
        Check("M[right] sdpa executed", False, None, "0 SDPA call(s)"),
    ]
    found = expected_on_eager(checks, ["self.upcast"])
    assert [c.passed for c in found] == [False, True]
    assert "the port keeps `self.upcast` on eager" in found[1].detail
    assert expected_on_eager(checks, []) == checks


def test_every_other_value_of_a_string_setting_is_a_trial_and_a_fallback_under_it_expects_no_sdpa(tmp_path: Path) -> None:
    """Each branch of a test of a string setting is a computation of its own: the checks run again under every other
    literal the attention compares the setting with (not None, which no config is built with). Where the class-style
    SDPA class falls back to `super().forward` under that value, no SDPA call is expected there; under a value its
    fallback test leaves false, one is."""
    from sdpa_port.verify.terms import eager_sides

    ported = _module(tmp_path, "settings_trials", SETTINGS)
    config = SimpleNamespace(position_embeddings_type="rotary", norm="pre")
    assert term_trials([ported.SdpaAttention], config) == [
        ("position_embeddings_type='relative'", {"position_embeddings_type": "relative"}),
        ("position_embeddings_type='relative_key'", {"position_embeddings_type": "relative_key"}),
    ]
    assert eager_sides([ported.SdpaAttention], {"position_embeddings_type": "relative_key"}) == [
        "self.position_embeddings_type == 'relative_key'"
    ]
    assert eager_sides([ported.SdpaAttention], {"position_embeddings_type": "relative"}) == []
    negated = _module(
        tmp_path,
        "settings_trials_not",
        SETTINGS.replace('if self.position_embeddings_type == "relative_key":', 'if output_attentions or self.position_embeddings_type != "rotary":'),
    )
    assert eager_sides([negated.SdpaAttention], {"position_embeddings_type": "relative"}) == [
        "self.position_embeddings_type != 'rotary'"
    ]
    assert eager_sides([negated.SdpaAttention], {"position_embeddings_type": "rotary"}) == []
