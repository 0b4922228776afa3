"""The rules giving a module checked on its own its window, its spatial sizes and its state layouts."""

from __future__ import annotations

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
    ]


def test_a_square_window_shapes_the_image() -> None:
    assert alone_inputs.state_shapes(32, 4, 9, (3, 3))[-1] == (BATCH, 32, 3, 3)
    assert alone_inputs.state_shapes(32, 4, 3, 3)[-1] == (BATCH, 32, *SPATIAL)


def test_heads_that_do_not_divide_the_width_split_nothing() -> None:
    assert all(len(shape) != 4 or shape[1] == 32 for shape in alone_inputs.state_shapes(32, 3, 7))
