"""Constructor values and input shapes for an attention module checked on its own, tried in order.

Imports nothing heavy: the rules only; `alone.py` builds the tensors.

A module built from its constructor alone (`alone.py`, `inline.py`) gets values by parameter name and synthetic
inputs. Vision and diffusion attention takes more than the `(batch, length, width)` states of a transformer:

- a window (`window_size`, `win_size`) or a feature map size (`feat_size`), which the module builds a relative
  position table or a position embedding from: tried as a square 2-D window, a 1-D window, a cube, in that order
  (`WINDOWS`); the tokens of a window are the product of its sides;
- states in other layouts, tried in order after the transformer's (`state_shapes`): seq-first `(length, batch,
  width)` (Megatron's layout, ChatGLM and CodeGeeX; taken where the masks run on it, see `alone._cases`), heads split out
  `(batch, length, heads, head_width)` (LoFTR), packed query, key and value channels first `(batch, 3 * width,
  length)` (guided diffusion's QKVAttention), channels first `(batch, width, length)` (a 1-D convolution), an image
  `(batch, width, height, width)` (a UNet's AttentionBlock);
- spatial sizes a forward takes beside flattened states (`forward(x, H, W)`): integers whose product is the length.

The width is the first linear layer's input width, else the first convolution's or norm's channels
(`alone._width`), so an image meets the group norm that reads it. Nothing here decides a pass: a layout is taken only where the original module runs on it, and the port
is compared with the original on exactly that input.
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

BATCH = 2
WINDOW_SIDE = 3
# a square window, a 1-D window, a cube: the first the original's constructor and forward accept is taken
WINDOWS: tuple[Any, ...] = ((WINDOW_SIDE, WINDOW_SIDE), WINDOW_SIDE, (2, WINDOW_SIDE, WINDOW_SIDE))
_WINDOW_NAMES = re.compile(r"^(window_size|win_size|window|feat_size)$")
_SPATIAL_NAMES = re.compile(r"^(H|W|h|w|height|width|Wh|Ww)$")
SPATIAL = (2, 4)  # height and width of flattened states where the forward takes them as integers


def window_parameter(klass: type) -> str | None:
    """The constructor's window or feature-map size parameter without a default, or None."""
    try:
        parameters = list(inspect.signature(klass.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    for parameter in parameters:
        if _WINDOW_NAMES.match(parameter.name) and parameter.default is parameter.empty:
            return parameter.name
    return None


def window_options(klass: type) -> list[dict[str, Any]]:
    """The constructor values to try for the window, in order; one empty option where the constructor takes none."""
    name = window_parameter(klass)
    if name is None:
        return [{}]
    return [{name: window} for window in WINDOWS]


def tokens(window: Any) -> int:
    """The tokens of a window: the product of its sides."""
    if isinstance(window, int):
        return window
    return math.prod(int(side) for side in window)


def spatial_parameters(forward: Any) -> list[str]:
    """The forward's required integer sizes of flattened states (`H`, `W`), in order."""
    out = []
    for parameter in inspect.signature(forward).parameters.values():
        if _SPATIAL_NAMES.match(parameter.name) and parameter.default is parameter.empty:
            out.append(parameter.name)
    return out


def spatial_values(names: list[str]) -> dict[str, int]:
    """The sizes given to `spatial_parameters`: height and width of SPATIAL, a single one the whole length."""
    if len(names) == 1:
        return {names[0]: math.prod(SPATIAL)}
    return {name: SPATIAL[min(index, 1)] for index, name in enumerate(names[:2])}


def state_shapes(width: int, heads: int, length: int, window: Any = None) -> list[tuple[int, ...]]:
    """The state layouts to try, the transformer's first (module docstring)."""
    shapes: list[tuple[int, ...]] = [(BATCH, length, width), (length, BATCH, width)]
    if heads > 0 and width % heads == 0:
        shapes.append((BATCH, length, heads, width // heads))
    shapes += [(BATCH, 3 * width, length), (BATCH, width, length)]
    if window is not None and not isinstance(window, int) and len(window) == 2:
        shapes.append((BATCH, width, int(window[0]), int(window[1])))
    else:
        shapes.append((BATCH, width, *SPATIAL))
    return list(dict.fromkeys(shapes))


def layout_note(shape: tuple[int, ...], width: int, length: int) -> str:
    """What a case's states were, where not a transformer's (batch, length, width)."""
    if len(shape) == 4 and shape[1] == width and shape[2] != length:
        return ", channels-first maps"
    if shape == (length, BATCH, width):
        return ", seq-first states"
    return ""


__all__ = [
    "layout_note",
    "WINDOWS",
    "window_parameter",
    "window_options",
    "tokens",
    "spatial_parameters",
    "spatial_values",
    "state_shapes",
]
