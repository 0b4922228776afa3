"""The rules giving a module checked on its own its window, its spatial sizes and its state layouts."""

from __future__ import annotations

import re
import sys
import types

from sdpa_port.verify import alone_inputs
from sdpa_port.verify.alone_inputs import BATCH, SPATIAL, WINDOWS


def _class(name: str, parameters: str) -> type:
    """A class whose constructor takes `parameters` (the rules read signatures only)."""
    namespace: dict[str, object] = {}
    exec(f"class {name}:\n    def __init__(self, {parameters}):\n        pass\n", namespace)
    klass = namespace[name]
    assert isinstance(klass, type)
    return klass


def _forward(parameters: str):  # type: ignore[no-untyped-def]
    namespace: dict[str, object] = {}
    exec(f"def forward({parameters}):\n    pass\n", namespace)
    return namespace["forward"]


Swin = _class("Swin", "dim, window_size, num_heads, qkv_bias=True")
Pool = _class("Pool", "in_features, feat_size, num_heads=4")
Defaulted = _class("Defaulted", "dim, window_size=7")
Plain = _class("Plain", "dim, num_heads")


def test_a_window_without_a_default_is_tried_square_then_flat_then_cubic() -> None:
    assert alone_inputs.window_parameter(Swin) == "window_size"
    assert alone_inputs.window_options(Swin) == [{"window_size": w} for w in WINDOWS]
    assert [type(w) for w in WINDOWS] == [tuple, int, tuple]
    assert [len(w) for w in WINDOWS if isinstance(w, tuple)] == [2, 3]


def test_a_feature_map_size_is_a_window_too() -> None:
    assert alone_inputs.window_parameter(Pool) == "feat_size"


def test_a_window_with_a_default_or_none_at_all_is_left_alone() -> None:
    assert alone_inputs.window_parameter(Defaulted) is None
    assert alone_inputs.window_options(Defaulted) == [{}]
    assert alone_inputs.window_options(Plain) == [{}]


def test_a_window_holds_the_product_of_its_sides() -> None:
    assert alone_inputs.tokens((3, 3)) == 9
    assert alone_inputs.tokens(3) == 3
    assert alone_inputs.tokens((2, 3, 3)) == 18


def test_spatial_sizes_are_the_required_height_and_width() -> None:
    forward = _forward("x, H, W, mask=None")
    optional = _forward("x, H=None")
    names = alone_inputs.spatial_parameters(forward)
    assert names == ["H", "W"]
    assert alone_inputs.spatial_values(names) == {"H": SPATIAL[0], "W": SPATIAL[1]}
    assert alone_inputs.spatial_parameters(optional) == []


def test_state_layouts_start_with_the_transformers_and_end_with_an_image() -> None:
    shapes = alone_inputs.state_shapes(32, 4, 7)
    assert shapes == [
        (BATCH, 7, 32),  # (batch, length, width): what every existing check ran on, first
        (7, BATCH, 32),  # seq-first (Megatron's layout)
        (BATCH, 7, 4, 8),  # heads split out
        (BATCH, 96, 7),  # packed query, key and value channels first
        (BATCH, 32, 7),  # channels first
        (BATCH, 32, *SPATIAL),  # an image
        (BATCH, 32, 1, alone_inputs.ROW),  # one row, split into square patches along it
        (BATCH, *SPATIAL, 32),  # channels-last maps (a windowed module's patch tokens)
    ]


def test_a_square_window_shapes_the_image() -> None:
    last = [(BATCH, 32, 3, 3), (BATCH, 32, 1, alone_inputs.ROW), (BATCH, 3, 3, 32)]  # channels-last of its sides
    assert alone_inputs.state_shapes(32, 4, 9, (3, 3))[-3:] == last
    assert alone_inputs.state_shapes(32, 4, 3, 3)[-3] == (BATCH, 32, *SPATIAL)


def test_the_row_image_holds_several_square_patches_of_side_four() -> None:
    """`b n x (y p1 p2)` with `p1=p2=4`: the row splits into whole 4x4 patches, more than one (one key alone makes
    every softmax 1, which no scale changes)."""
    assert alone_inputs.ROW % 16 == 0 and alone_inputs.ROW // 16 > 1


def test_heads_that_do_not_divide_the_width_split_nothing() -> None:
    assert all(len(shape) != 4 or 32 in (shape[1], shape[3]) for shape in alone_inputs.state_shapes(32, 3, 7))



# classes and functions written out, not made by `exec`: the rules read their source
class Subscripted:
    def __init__(self, dim, window_size=None):  # type: ignore[no-untyped-def]
        self.sizes = (dim, window_size[0])


class Unread:
    def __init__(self, dim, window_size=None):  # type: ignore[no-untyped-def]
        self.sizes = (dim, window_size)


def _init(self, dim, input_size, k, i):  # type: ignore[no-untyped-def]
    return input_size[0] + input_size[2] + k[i]


def _forward_roles(self, x, pos_k, m, n):  # type: ignore[no-untyped-def]
    if pos_k is not None:
        x = x + pos_k
    s = x.masked_fill(m, -1.0)
    s.masked_fill_(n, 0.0)
    return s


def _forward_plain(self, x, y):  # type: ignore[no-untyped-def]
    return x @ y


def test_a_window_defaulting_to_none_that_init_subscripts_is_tried_before_its_default() -> None:
    """`q_size = window_size[0]` in `__init__`: the windows first (None would fail there), the default last (where
    `__init__` subscripts it only under `if window_size:`, and no window runs)."""
    assert alone_inputs.window_parameter(Subscripted) == "window_size"
    assert alone_inputs.window_options(Subscripted) == [*({"window_size": w} for w in WINDOWS), {}]
    # not subscripted: the default stays, as before
    assert alone_inputs.window_parameter(Unread) is None
    assert alone_inputs.window_options(Unread) == [{}]


def test_subscripted_names_need_as_many_sides_as_their_largest_constant_index() -> None:
    assert alone_inputs.subscripted(_init) == {"input_size": 3}
    assert alone_inputs.sides(3) == WINDOWS[2] and alone_inputs.sides(2) == WINDOWS[0]
    assert alone_inputs.sides(4) == (alone_inputs.WINDOW_SIDE,) * 4
    assert alone_inputs.subscripted(len) == {}  # no source to read: nothing


def test_a_forward_parameter_tested_against_none_is_a_term_and_one_filled_where_is_a_mask() -> None:
    assert alone_inputs.forward_roles(_forward_roles) == {"pos_k": "term", "m": "mask", "n": "mask"}
    assert alone_inputs.forward_roles(_forward_plain) == {}


POSITIONS = """def forward(self, x, seg, flags, idx, rows, mask):
    x = x.masked_fill(flags.unsqueeze(-1), 0.0).masked_fill(mask, 0.0)
    x = pool(x, index=seg) + torch.gather(x, 1, idx.unsqueeze(-1).expand_as(x))
    return x.index_select(0, rows)
"""


def test_positions_a_gather_or_index_takes_and_flags_reshaped_to_fill_by_are_read() -> None:
    """PoNet's segment pooling: `index=seg`, `torch.gather(x, 1, idx...)` and `x.index_select(0, rows)` take
    positions; `flags.unsqueeze(-1)` fills by a boolean per token, where a mask given as it is stays a mask."""
    module = types.ModuleType("positions_forward_module")
    module.__sdpa_port_source__ = POSITIONS  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        exec(compile(POSITIONS, "<kept>", "exec"), module.__dict__)
        roles = alone_inputs.forward_roles(module.forward)
    finally:
        del sys.modules[module.__name__]
    assert roles == {"seg": "index", "idx": "index", "rows": "index", "flags": "flags", "mask": "mask"}, roles


def test_a_2d_window_gives_the_height_and_width() -> None:
    assert alone_inputs.spatial_values(["H", "W"], (3, 3)) == {"H": 3, "W": 3}
    assert alone_inputs.spatial_values(["H", "W"], 3) == {"H": SPATIAL[0], "W": SPATIAL[1]}
    assert alone_inputs.spatial_values(["hw"], (3, 3)) == {"hw": 9}


def test_an_input_or_output_width_is_a_width_named_with_in_or_out() -> None:
    widths = re.compile(r"^(dim|channels|embed_dim)$")
    named = ("dim_out", "out_dim", "out_channels", "dim_in", "in_channels")
    assert all(alone_inputs.side_width(name, widths) for name in named)
    assert not any(alone_inputs.side_width(name, widths) for name in ("dim", "out_proj", "dropout", "layout", "in_proj", "dim_inner"))


def test_the_text_kept_beside_a_loaded_module_is_read_where_its_file_is_gone() -> None:
    """A verification loading a text already loaded finds the first module, whose temporary file is gone."""
    module = types.ModuleType("kept_for_alone_inputs")
    text = "def f(self, x, m):\n    return x.masked_fill(m, 0.0)\n"
    exec(compile(text, "/gone/kept_for_alone_inputs.py", "exec"), module.__dict__)
    module.__sdpa_port_source__ = text  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        assert alone_inputs.forward_roles(module.f) == {"m": "mask"}
    finally:
        del sys.modules[module.__name__]


def _kept_forward(body: str):  # type: ignore[no-untyped-def]
    """A forward defined from text its module keeps (`loader.source_of`), as a loaded port's is."""
    text = f"def forward(self, x, need_weights=True, head_mask=None, before_softmax=False):\n{body}"
    module = types.ModuleType("kept_forward_module")
    module.__sdpa_port_source__ = text  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    exec(compile(text, "<kept>", "exec"), module.__dict__)
    return module.forward


def test_the_sdpa_side_values_are_read_from_the_fallback_test() -> None:
    """Graphormer's SDPA class asks for weights by default: checked on its own, it is given the values that keep it
    on SDPA, read from the test that sends it back to eager."""
    fallback = "    if need_weights or before_softmax or head_mask is not None:\n        return super().forward(x)\n    return x\n"
    assert alone_inputs.sdpa_side_values(_kept_forward(fallback)) == {
        "need_weights": False,
        "before_softmax": False,
        "head_mask": None,
    }
    # a test of another form, or no fallback to the parent: nothing assumed
    other = fallback.replace("head_mask is not None", "head_mask == 3")
    assert alone_inputs.sdpa_side_values(_kept_forward(other)) == {}
    assert alone_inputs.sdpa_side_values(_kept_forward("    return x\n")) == {}


SWITCHED = '''
class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        if config.pre_ln:
            self.norm = nn.LayerNorm(config.hidden_size)
        self.width = config.width_mult * 2

    def forward(self, x):
        x = self.norm(x) if self.config.pre_ln else x
        if not self.config.dim_dropout and self.training:
            return x
        return x
'''


def test_a_config_attribute_only_tested_for_truth_is_a_switch() -> None:
    assert alone_inputs.tested_only(SWITCHED, "pre_ln") and alone_inputs.tested_only(SWITCHED, "dim_dropout")
    # read for its value, or never read
    assert not alone_inputs.tested_only(SWITCHED, "width_mult") and not alone_inputs.tested_only(SWITCHED, "absent")
    # one read for its value among tests
    assert not alone_inputs.tested_only(SWITCHED + "\n    x = config.pre_ln * 2\n", "pre_ln")


def _forward_embeds(self, x, relation, mask):  # type: ignore[no-untyped-def]
    bias = self.links(relation).permute(0, 3, 1, 2)
    return self.proj(x, mask) + bias


def _forward_transfo(self, w, r, H):  # type: ignore[no-untyped-def]
    return w.size(0) + r.size(0) + H


def test_a_parameter_passed_alone_to_a_submodule_is_read_as_embedded_there() -> None:
    """`self.links(relation)`: `relation` goes to `links` (an `nn.Embedding` there makes it an index tensor); a call
    with more arguments (`self.proj(x, mask)`) is no embedding's."""
    assert alone_inputs.embedded(_forward_embeds) == {"relation": "links"}
    assert alone_inputs.embedded(_forward_plain) == {}
    assert alone_inputs.index_shapes(7) == [(BATCH, 7, 7), (BATCH, 7)]  # a pair of positions first, then one


def test_a_spatial_name_whose_attributes_the_forward_reads_is_a_tensor() -> None:
    """Transformer-XL's states are `w` (`w.size(0)`): not a width; `H`, read for no attribute, still is."""
    assert alone_inputs.spatial_parameters(_forward_transfo) == ["H"]


GUARDED = """
import torch

try:
    from timm_missing_here.layers import to_2tuple, Mlp as MlpAlias
except ImportError:
    pass
try:
    from json import loads
except ImportError:
    pass
"""


def test_a_name_imported_in_a_try_block_from_a_missing_package_is_explained() -> None:
    from sdpa_port.verify import stubs

    assert stubs.guarded_import(GUARDED, "to_2tuple") == "timm_missing_here.layers"
    assert stubs.guarded_import(GUARDED, "MlpAlias") == "timm_missing_here.layers"
    assert stubs.guarded_import(GUARDED, "loads") is None  # installed: the NameError is another's
    assert stubs.guarded_import(GUARDED, "other") is None
    said = stubs.explained(NameError("name 'to_2tuple' is not defined"), GUARDED)
    assert said.startswith("name 'to_2tuple' is not defined: the file imports it from `timm_missing_here.layers`")
    assert said.endswith("inside a try block, and `timm_missing_here` is not installed here")
    assert stubs.explained(ValueError("bad"), GUARDED) == "bad"


def test_a_stand_in_used_at_run_time_names_the_missing_package() -> None:
    """`from megatron_util import mpu`, then `mpu.get_model_parallel_world_size()` once loaded: the reason names
    `megatron_util`; a stand-in of the file's own package (relative imports) names none."""
    import pytest

    from sdpa_port.verify import stubs

    missing = stubs.StandInModule("megatron_missing_here")
    named = r"mpu.world_size stands in .*`megatron_missing_here.mpu`: `megatron_missing_here` is not"
    with pytest.raises(stubs.StubUsed, match=named):
        missing.mpu.world_size()
    own = stubs.StandInModule(stubs.PACKAGE + ".helpers")
    with pytest.raises(stubs.StubUsed, match=r"cannot satisfy$"):
        own.scale_of.value


def test_a_class_source_is_read_from_the_kept_text_where_its_file_is_gone() -> None:
    """A second verification of the same original finds its module loaded from a file since removed: the config
    a class reads (`generic_config`) is still read from its source."""
    import pytest

    module = types.ModuleType("kept_class_for_alone_inputs")
    text = "import os\n\n\nclass Reads:\n    def f(self, config):\n        return config.hidden_size\n"
    exec(compile(text, "/gone/kept_class_for_alone_inputs.py", "exec"), module.__dict__)
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(OSError):
            alone_inputs.class_source(module.Reads)  # nothing kept: unread, as before
        module.__sdpa_port_source__ = text  # type: ignore[attr-defined]
        assert alone_inputs.class_source(module.Reads).startswith("class Reads:\n    def f(self, config):")
    finally:
        del sys.modules[module.__name__]


def _kept_module(name: str, text: str, run: str) -> types.ModuleType:
    """A module keeping `text` as its source (`loader.source_of`) and running `run`, the same classes without the
    imports this Python lacks (no torch here: the rules read the text, never the layers)."""
    module = types.ModuleType(name)
    module.__sdpa_port_source__ = text  # type: ignore[attr-defined]
    sys.modules[name] = module
    exec(compile(run, "<kept>", "exec"), module.__dict__)
    return module


SIZED = """class Context:
    def __init__(self, in_channels, key_channels, scale=1, temperature=None):
        self.key_channels = key_channels
        self.temperature = temperature
        self.pool = nn.MaxPool2d(kernel_size=(scale, scale))
        self.f_key = nn.Conv2d(in_channels=in_channels, out_channels=self.key_channels, kernel_size=1)


class Context2D(Context):
    pass


class Rows:
    def __init__(self, n_dims, width=14, heads=4, table=None):
        self.q = nn.Linear(n_dims, n_dims * 3)
        self.rel = nn.Parameter(torch.randn([1, heads, n_dims // heads, width]))
        self.table = table
"""


def test_a_constructor_parameter_given_a_layer_as_its_size_is_read_as_sized() -> None:
    """`key_channels`, a convolution's output channels through `self.key_channels`, is a width the checks can give;
    a pooling kernel or a value only stored is not; a subclass keeping its base's `__init__` reads the base's."""
    from sdpa_port.verify.layer_widths import layer_sized

    module = _kept_module("kept_layer_sizes", "from torch import nn\nimport torch\n\n\n" + SIZED, SIZED)
    try:
        assert layer_sized(module.Context) == {"in_channels", "key_channels"}
        assert layer_sized(module.Context2D) == {"in_channels", "key_channels"}
        assert layer_sized(module.Rows) == {"n_dims", "width", "heads"}
    finally:
        del sys.modules[module.__name__]


def test_the_image_sides_are_the_names_a_forward_unpacks_from_its_states_sizes() -> None:
    """`n, c, width, height = x.size()` names the image's sides; three names, or a local's sizes, name none."""
    assert alone_inputs.unpacked_sides(_forward_body("self, x", "n_batch, C, width, height = x.size()")) == (
        "width",
        "height",
    )
    assert alone_inputs.unpacked_sides(_forward_body("self, x", "b, c, h, w = x.shape")) == ("h", "w")
    assert alone_inputs.unpacked_sides(_forward_body("self, x", "b, n, c = x.shape")) is None
    assert alone_inputs.unpacked_sides(_forward_body("self, x", "y = x\n    b, c, h, w = y.shape")) is None


def _forward_body(parameters: str, body: str):  # type: ignore[no-untyped-def]
    text = f"def forward({parameters}):\n    {body}\n"
    module = types.ModuleType(f"kept_sides_{abs(hash(text))}")
    module.__sdpa_port_source__ = text  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    exec(compile(text, "<kept>", "exec"), module.__dict__)
    return module.forward


def test_the_modules_own_image_comes_before_the_default_image_and_only_small() -> None:
    shapes = alone_inputs.state_shapes(32, 4, 7, image=(5, 3))
    assert shapes.index((BATCH, 32, 5, 3)) == shapes.index((BATCH, 32, *SPATIAL)) - 1
    assert (BATCH, 32, 64, 64) not in alone_inputs.state_shapes(32, 4, 7, image=(64, 64))


class _Held:
    """A module as the folding rules see it: the window it holds and its forward's signature."""

    def __init__(self, window: object, parameters: str) -> None:
        self.window_size = window
        self.forward = _forward(parameters)


def test_a_held_window_of_frames_folds_the_frames_into_the_batch_by_the_forwards_counts() -> None:
    """Each count 1 or the window's frames, smallest batch first; a frame's tokens the length."""
    options = alone_inputs.folded_options(_Held((16, 7, 7), "x, mask=None, batch_size=8, frame_len=8"))
    assert options[0] == ({"batch_size": 1, "frame_len": 1}, BATCH, (7, 7))
    assert [batch for _, batch, _ in options] == [BATCH, BATCH * 16, BATCH * 16, BATCH * 256]
    assert ({"batch_size": 1, "frame_len": 16}, BATCH * 16, (7, 7)) in options
    assert "frame_len=16" in alone_inputs.folded_note(_Held((16, 7, 7), "x"), {"frame_len": 16}, 32)


def test_no_folding_without_a_held_window_of_three_sides_or_integer_counts() -> None:
    """Look-alikes: a 2-D window, a window of a non-integer side, a boolean default, no default, too many counts."""
    assert alone_inputs.folded_options(_Held((7, 7), "x, frame_len=8")) == []
    assert alone_inputs.folded_options(_Held((16, 7, 7.0), "x, frame_len=8")) == []
    assert alone_inputs.folded_options(_Held((16, 7, 7), "x, mask=None, shift=False")) == []
    assert alone_inputs.folded_options(_Held((16, 7, 7), "x, frame_len")) == []
    assert alone_inputs.folded_options(_Held((16, 7, 7), "x, a=1, b=2, c=3, d=4")) == []
    assert alone_inputs.folded_options(_Held(None, "x, frame_len=8")) == []


def test_the_states_take_the_batch_given() -> None:
    shapes = alone_inputs.state_shapes(32, 4, 49, (7, 7), batch=48)
    assert shapes[:2] == [(48, 49, 32), (49, 48, 32)]
    assert all(shape[0] == 48 for shape in shapes[2:])
