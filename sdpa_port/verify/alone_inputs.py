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
  `(batch, width, height, width)` (a UNet's AttentionBlock), an image of one row of `ROW` tokens (a spherical
  map, whose row a forward splits into square patches), last channels-last maps `(batch, height, width, channels)`
  of a 2-D window's sides (a windowed module's patch tokens), its other required tensors then tried as tokens too;
- spatial sizes a forward takes beside flattened states (`forward(x, H, W)`): integers whose product is the length,
  a 2-D window's sides where the module has one; not a name whose attributes the forward reads (`w.size(0)`);
- a window of (frames, height, width) the module holds, whatever it was given, where no input runs and the forward
  takes counts defaulting to integers (`batch_size=8, frame_len=8`): the frames folded into the batch, each count 1
  or the window's frames, a frame's tokens the length (`folded_options`);
- a required tensor after the states: the states' shape, then a `(length, width)` table shared by the batch
  (Transformer-XL's relative position embeddings `r`), in `alone._cases_at`.

Some values are read from the code rather than the names (`reads`):

- a window defaulting to None that `__init__` subscripts (`q_size = window_size[0]`) may be needed all the same: the
  windows are tried first, the default last;
- a required constructor parameter `__init__` subscripts with constant indices (`input_size[1]`) is a tuple of that
  many sides (`sides`); a required width named for an input or output (`dim_in`, `dim_out`, `out_channels`) is the
  width;
- a config attribute whose name tells no value but which the class only tests for truth (`if config.pre_ln:`) is a
  switch, turned off (`tested_only`);
- a required forward parameter that the forward tests against None (`if pos_k is not None`) is an optional score term,
  and one it fills the scores where (`scores.masked_fill(m, ...)`) is a mask (`forward_roles`); one it reshapes to
  fill by (`x.masked_fill(m.unsqueeze(-1), ...)`) is a boolean per token, the first flagged, and one passed as
  positions (`index=segment_index`, `x.gather(1, idx)`) is a segment per two tokens, long, `(batch, length)`: PoNet's
  segment pooling;
- a required forward parameter the forward passes to an `nn.Embedding` of the module (`self.links(relation)`) is an
  index tensor: long, below the embedding's size, one per pair of positions, else one per position (`embedded`,
  `index_shapes`);
- a forward unpacking an image's sides into names the module holds integers of gets images of those sides
  (`unpacked_sides`). Before, `MHSA(n_dims, width=14, height=14)` runs on no image: its relative position parameters
  hold 14 * 14 positions and the default image 2 * 4. After:

      n_batch, C, width, height = x.size()     # unpacked_sides(forward) == ("width", "height")
      -> states (batch, channels, module.width, module.height), tried before the default image

The width is the first linear layer's input width, else the first convolution's or norm's channels
(`alone._width`), so an image meets the group norm that reads it. Nothing here decides a pass: a layout is taken only where the original module runs on it, and the port
is compared with the original on exactly that input.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import math
import re
import sys
import textwrap
from typing import Any

from sdpa_port.verify.terms import returns_super_forward

BATCH = 2
WINDOW_SIDE = 3
# a square window, a 1-D window, a cube: the first the original's constructor and forward accept is taken
WINDOWS: tuple[Any, ...] = ((WINDOW_SIDE, WINDOW_SIDE), WINDOW_SIDE, (2, WINDOW_SIDE, WINDOW_SIDE))
_WINDOW_NAMES = re.compile(r"^(window_size|win_size|window|feat_size)$")
_SPATIAL_NAMES = re.compile(r"^(H|W|h|w|height|width|Wh|Ww)$")
SPATIAL = (2, 4)  # height and width of flattened states where the forward takes them as integers
# a one-row image's side, tried last: a multiple of the squares (1, 4, 16) of the patch sides a forward may split a
# row into, with several patches (`b n x (y p1 p2)`, `p1=k, p2=k`, `k=4`: four keys), which the (2, 4) image is not
ROW = 64


def window_parameter(klass: type) -> str | None:
    """The constructor's window or feature-map size parameter without a default, or defaulting to None where
    `__init__` subscripts it all the same; or None."""
    try:
        parameters = list(inspect.signature(klass.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    for parameter in parameters:
        if not _WINDOW_NAMES.match(parameter.name):
            continue
        if parameter.default is parameter.empty:
            return parameter.name
        if parameter.default is None and parameter.name in subscripted(klass.__init__):
            return parameter.name
    return None


def _tree(function: Any) -> ast.AST | None:
    """The parsed source of a function, or None where it cannot be read.

    A verified module keeps the text it was loaded from (`loader.source_of`): its temporary file may be gone, or hold
    another text, when a later verification of the same text finds the module already loaded."""
    function = getattr(function, "__func__", function)
    code = getattr(function, "__code__", None)
    kept = getattr(sys.modules.get(getattr(function, "__module__", None) or ""), "__sdpa_port_source__", None)
    try:
        if isinstance(kept, str) and code is not None:
            lines = kept.splitlines(keepends=True)[code.co_firstlineno - 1 :]
            source = "".join(inspect.getblock(lines))
        else:
            source = inspect.getsource(function)
        return ast.parse(textwrap.dedent(source))
    except (OSError, TypeError, SyntaxError, IndexError):
        return None


def class_source(klass: type) -> str:
    """A class's source, read from the text its module keeps where its file is gone (`_tree`); OSError where none."""
    try:
        return inspect.getsource(klass)
    except (OSError, TypeError) as error:
        kept = getattr(sys.modules.get(klass.__module__), "__sdpa_port_source__", None)
        if not isinstance(kept, str):
            raise OSError(str(error)) from error
        for node in ast.parse(kept).body:
            if isinstance(node, ast.ClassDef) and node.name == klass.__name__:
                return ast.get_source_segment(kept, node) or ""
        raise OSError(str(error)) from error


def sdpa_side_values(forward: Any) -> dict[str, Any]:
    """The values of the parameters that send an SDPA class's call back to eager, on its SDPA side.

    The class style's forward opens with `if output_attentions or head_mask is not None: ... return super().forward(
    ...)`: each name tested alone is False there, each tested `is not None` is None. A check of the class on its own
    passes them, or a forward whose default asks for weights (Graphormer's `need_weights=True`) never reaches SDPA."""
    tree = _tree(forward)
    function = tree.body[0] if isinstance(tree, ast.Module) and tree.body else None
    if not isinstance(function, ast.FunctionDef):
        return {}
    test = next(
        (s.test for s in function.body if isinstance(s, ast.If) and any(returns_super_forward(r) for r in s.body)), None
    )
    if test is None:
        return {}
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
    out: dict[str, Any] = {}
    for part in parts:
        if isinstance(part, ast.Name):
            out[part.id] = False
        elif (
            isinstance(part, ast.Compare)
            and isinstance(part.left, ast.Name)
            and len(part.ops) == 1
            and isinstance(part.ops[0], ast.IsNot)
            and isinstance(part.comparators[0], ast.Constant)
            and part.comparators[0].value is None
        ):
            out[part.left.id] = None
        else:
            return {}  # a test of another form: nothing is assumed of it
    return out


def subscripted(function: Any) -> dict[str, int]:
    """The names a function subscripts with a constant integer (`window_size[0]`), each with the number of sides its
    largest index needs."""
    tree = _tree(function)
    out: dict[str, int] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            index = node.slice
            if isinstance(index, ast.Constant) and type(index.value) is int and index.value >= 0:
                out[node.value.id] = max(out.get(node.value.id, 0), index.value + 1)
    return out


_SIDE = re.compile(r"^(in|out)_|_(in|out)$")


def side_width(name: str, widths: re.Pattern[str]) -> bool:
    """Whether a parameter names an input or output width: a name of `widths` with `in` or `out` beside it (`dim_in`,
    `dim_out`, `in_channels`)."""
    return bool(_SIDE.search(name)) and bool(widths.match(_SIDE.sub("", name)))


def tested_only(source: str, name: str) -> bool:
    """Whether every read of `config.<name>` or `self.config.<name>` in a class's source only tests it for truth
    (`if config.pre_ln:`, `if not self.config.dim_dropout:`, `a if config.flag else b`): a switch, which the checks
    turn off."""
    tree = ast.parse(textwrap.dedent(source))
    tests: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            tests.add(id(node.test))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            tests.add(id(node.operand))
        elif isinstance(node, ast.BoolOp):
            tests.update(id(value) for value in node.values)
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == name and _is_config(n.value)]
    return bool(reads) and all(id(read) in tests for read in reads)


def _is_config(node: ast.expr) -> bool:
    """`config` or `self.config`."""
    if isinstance(node, ast.Name):
        return node.id == "config"
    if not isinstance(node, ast.Attribute) or node.attr != "config":
        return False
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def sides(count: int) -> tuple[int, ...]:
    """A size of `count` sides for a parameter subscripted that far: the window of that many sides, else all equal."""
    found = next((w for w in WINDOWS if isinstance(w, tuple) and len(w) == count), None)
    return found if found is not None else (WINDOW_SIDE,) * count


# calls whose `index` argument (by keyword, or at this position) holds positions along an axis, and the methods
# that reshape a tensor without changing what it holds
_INDEXED = {"gather": 1, "scatter": 1, "scatter_add": 1, "scatter_reduce": 1, "index_select": 1}
_RESHAPES = {"unsqueeze", "view", "reshape", "expand", "expand_as", "bool"}


def forward_roles(forward: Any) -> dict[str, str]:
    """What the forward's parameters are by how it uses them: `"term"` for one tested against None (`x is not None`),
    `"mask"` for one the scores are filled where (`masked_fill(m, ...)`, the first argument), `"flags"` for one
    reshaped first (`x.masked_fill(m.unsqueeze(-1), ...)`: a boolean per token, PoNet's `token_type_mask`), and
    `"index"` for one passed as positions (`index=segment_index`, `x.gather(1, idx)`)."""
    tree = _tree(forward)
    out: dict[str, str] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and len(node.ops) == 1:
            right = node.comparators[0]
            if isinstance(node.ops[0], (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant) and right.value is None:
                out.setdefault(node.left.id, "term")
        elif isinstance(node, ast.Call):
            for name in _indices(node):
                out.setdefault(name, "index")
            if not (isinstance(node.func, ast.Attribute) and node.args):
                continue
            first = node.args[0]
            if node.func.attr not in ("masked_fill", "masked_fill_"):
                continue
            reshaped = _reshaped_name(first)
            if isinstance(first, ast.Name):
                out[first.id] = "mask"
            elif reshaped is not None:
                out.setdefault(reshaped, "flags")
    return out


def _indices(call: ast.Call) -> list[str]:
    """The names a call takes as positions, as they are or reshaped (`idx.unsqueeze(-1)`): its `index=` keyword, or
    the argument at the index position of a gather or scatter (`torch.gather(x, 1, idx)` one further than the
    method)."""
    given = [keyword.value for keyword in call.keywords if keyword.arg == "index"]
    method = call.func.attr if isinstance(call.func, ast.Attribute) else None
    if method in _INDEXED:
        at = _INDEXED[method] + (isinstance(call.func.value, ast.Name) and call.func.value.id == "torch")
        given += call.args[at : at + 1]
    names = [node.id if isinstance(node, ast.Name) else _reshaped_name(node) for node in given]
    return [name for name in names if name is not None]


def _reshaped_name(node: ast.expr) -> str | None:
    """The name under a chain of reshaping methods (`m.unsqueeze(-1)`, `m[:, None]`), or None."""
    reshaped = False
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _RESHAPES:
            node, reshaped = node.func.value, True
        elif isinstance(node, ast.Subscript):
            node, reshaped = node.value, True
        else:
            break
    return node.id if reshaped and isinstance(node, ast.Name) else None



def embedded(forward: Any) -> dict[str, str]:
    """The forward's parameters it passes to a submodule of its own as the only argument (`self.links(relation)`),
    each with that submodule's attribute name; `alone._cases` takes those that are `nn.Embedding`s as index tensors."""
    tree = _tree(forward)
    out: dict[str, str] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and len(node.args) == 1
            and not node.keywords
            and isinstance(node.args[0], ast.Name)
        ):
            out.setdefault(node.args[0].id, node.func.attr)
    return out


def index_shapes(length: int) -> list[tuple[int, ...]]:
    """The shapes tried for an index tensor a forward embeds: one index per pair of positions (a relation between
    tokens, added to the scores once embedded), then one per position."""
    return [(BATCH, length, length), (BATCH, length)]


def window_options(klass: type) -> list[dict[str, Any]]:
    """The constructor values to try for the window, in order; one empty option where the constructor takes none."""
    name = window_parameter(klass)
    if name is None:
        return [{}]
    options: list[dict[str, Any]] = [{name: window} for window in WINDOWS]
    # a window defaulting to None, which `__init__` may subscript only where one is given (`if window_size:`): its
    # default last, where no window runs (a table sized for a class token beside the window's)
    return options if inspect.signature(klass.__init__).parameters[name].default is not None else [*options, {}]


def tokens(window: Any) -> int:
    """The tokens of a window: the product of its sides."""
    if isinstance(window, int):
        return window
    return math.prod(int(side) for side in window)


def spatial_parameters(forward: Any) -> list[str]:
    """The forward's required integer sizes of flattened states (`H`, `W`), in order; not a name whose attributes
    the forward reads (`w.size(0)`: Transformer-XL's states are `w`), which is a tensor."""
    tree = _tree(forward)
    read = {
        node.value.id
        for node in (ast.walk(tree) if tree is not None else ())
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    out = []
    for parameter in inspect.signature(forward).parameters.values():
        name = parameter.name
        if _SPATIAL_NAMES.match(name) and parameter.default is parameter.empty and name not in read:
            out.append(name)
    return out


def spatial_values(names: list[str], window: Any = None) -> dict[str, int]:
    """The sizes given to `spatial_parameters`: height and width of SPATIAL, or of a 2-D window where the module has
    one (its tokens are the states' length); a single one the whole length."""
    plane = (int(window[0]), int(window[1])) if isinstance(window, tuple) and len(window) == 2 else SPATIAL
    if len(names) == 1:
        return {names[0]: math.prod(plane)}
    return {name: plane[min(index, 1)] for index, name in enumerate(names[:2])}


# the most pixels an image of the module's own sides may have: the scores are (pixels, pixels) per head
MOST_PIXELS = 1024


def unpacked_sides(forward: Any) -> tuple[str, str] | None:
    """The names a forward unpacks an image's height and width into from a parameter's sizes, as
    `n_batch, C, width, height = x.size()` (or `= x.shape`) does: the last two of four names; None where it unpacks
    none. A module holding integers of those names (`self.width`, `self.height`, which its relative position tables
    are sized to) runs on images of those sides only."""
    tree = _tree(forward)
    function = tree.body[0] if isinstance(tree, ast.Module) and tree.body else None
    if not isinstance(function, ast.FunctionDef):
        return None
    parameters = {a.arg for a in function.args.args[1:]}
    for node in ast.walk(function):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple)):
            continue
        names = [e.id for e in node.targets[0].elts if isinstance(e, ast.Name)]
        value = node.value.func if isinstance(node.value, ast.Call) and not node.value.args else node.value
        sized = isinstance(value, ast.Attribute) and value.attr in ("size", "shape")
        if len(names) == 4 == len(node.targets[0].elts) and sized and isinstance(value, ast.Attribute):
            if isinstance(value.value, ast.Name) and value.value.id in parameters:
                return names[2], names[3]
    return None


def image_sides(module: Any) -> tuple[int, int] | None:
    """The sides of the images the module is built for: the integers it holds under the names its forward unpacks
    an image's height and width into (`unpacked_sides`), or None."""
    names = unpacked_sides(module.forward)
    if names is None:
        return None
    sides = [getattr(module, name, None) for name in names]
    if all(type(side) is int and side > 0 for side in sides):
        return int(sides[0]), int(sides[1])  # type: ignore[arg-type]
    return None


def state_shapes(
    width: int,
    heads: int,
    length: int,
    window: Any = None,
    image: tuple[int, int] | None = None,
    batch: int = BATCH,
) -> list[tuple[int, ...]]:
    """The state layouts to try, the transformer's first (module docstring); `image`, the sides of the module's own
    images (`unpacked_sides`), before the default image; `batch` sequences or maps."""
    shapes: list[tuple[int, ...]] = [(batch, length, width), (length, batch, width)]
    if heads > 0 and width % heads == 0:
        shapes.append((batch, length, heads, width // heads))
    shapes += [(batch, 3 * width, length), (batch, width, length)]
    if image is not None and image[0] * image[1] <= MOST_PIXELS:
        shapes.append((batch, width, *image))
    if window is not None and not isinstance(window, int) and len(window) == 2:
        shapes.append((batch, width, int(window[0]), int(window[1])))
    else:
        shapes.append((batch, width, *SPATIAL))
    shapes.append((batch, width, 1, ROW))  # one row (a spherical map's layout), split into patches along it
    # last, channels-last maps (batch, h, w, width) of a 2-D window's sides, else SPATIAL: a windowed module's patch
    # tokens (vidt's `B, H, W, C = x.shape`)
    plane = (int(window[0]), int(window[1])) if isinstance(window, tuple) and len(window) == 2 else SPATIAL
    shapes.append((batch, *plane, width))
    return list(dict.fromkeys(shapes))


def layout_note(shape: tuple[int, ...], width: int, length: int, batch: int = BATCH) -> str:
    """What a case's states were, where not a transformer's (batch, length, width)."""
    if len(shape) == 4 and shape[1] == width and shape[2] != length:
        return f", channels-first maps of {shape[2]} x {shape[3]}"
    if shape == (length, batch, width):
        return ", seq-first states"
    if len(shape) == 4 and shape[3] == width and shape[1] != width and shape[2] != 1:
        return f", channels-last maps of {shape[1]} x {shape[2]}"
    return ""


# the forward's counts folded into the batch, at most this many (`batch_size`, `frame_len`): each 1 or the frames
MOST_COUNTS = 3


def held_frames(module: Any) -> tuple[int, int, int] | None:
    """The window of (frames, height, width) the module holds (`self.window_size = (16, 7, 7)`), whatever its
    constructor was given; or None."""
    for name in ("window_size", "win_size", "window"):
        value = getattr(module, name, None)
        if isinstance(value, (tuple, list)) and len(value) == 3 and all(type(s) is int and s > 0 for s in value):
            return int(value[0]), int(value[1]), int(value[2])
    return None


def counts(forward: Any) -> list[str]:
    """The forward's parameters defaulting to an integer, not a boolean (`batch_size=8, frame_len=8`)."""
    return [
        parameter.name
        for parameter in inspect.signature(forward).parameters.values()
        if type(parameter.default) is int
    ]


def folded_options(module: Any) -> list[tuple[dict[str, int], int, tuple[int, int]]]:
    """The frames of a held window folded into the batch, where the forward takes counts that view it: each option
    the counts given, the states' batch and the window of one frame, smallest batch first.

    Video Swin variants attend within one frame of a window and fold the frames into the batch, viewing the scores
    back by counts the forward takes: `attn.view(batch_size, frame_len, -1, heads, N, N)` with a bias per frame of
    the window the module holds. Before, `WindowAttention3D(dim, window_size, heads)` holding `(16, 7, 7)` runs on no
    input: its length is a frame's 49 tokens and its batch `batch_size * frame_len` windows' frames. After:

        forward(x, mask=None, batch_size=8, frame_len=8)   # counts(forward) == ["batch_size", "frame_len"]
        -> x of (2 * batch_size * frame_len, 7 * 7, width), each count 1 or 16: two windows per frame
    """
    frames = held_frames(module)
    names = counts(module.forward)
    if frames is None or not names or len(names) > MOST_COUNTS:
        return []
    options = [
        (dict(zip(names, values)), BATCH * math.prod(values), (frames[1], frames[2]))
        for values in itertools.product((1, frames[0]), repeat=len(names))
    ]
    return sorted(options, key=lambda option: option[1])


def folded_note(module: Any, given: dict[str, int], batch: int) -> str:
    """What a case of `folded_options` ran with."""
    shown = ", ".join(f"{name}={value}" for name, value in given.items())
    return f" (every case: the frames of the window {held_frames(module)} folded into a batch of {batch}, {shown})"


__all__ = [
    "folded_note",
    "image_sides",
    "folded_options",
    "layout_note",
    "WINDOWS",
    "window_parameter",
    "window_options",
    "tokens",
    "spatial_parameters",
    "spatial_values",
    "state_shapes",
    "unpacked_sides",
    "subscripted",
    "sides",
    "side_width",
    "tested_only",
    "forward_roles",
    "embedded",
    "index_shapes",
    "class_source",
]
