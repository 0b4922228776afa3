"""Scales held in `self.` attributes: which bindings make one number for every query and key (SDPA's `scale=`), which
a tensor the same along the keys (the query scaled), and which neither (S102).

An attribute is a number when every statement of the class that binds it gives a number, read in its own method:
`__init__`'s locals by their bindings, its parameters by what the constructor declares them (a number default, an
`int` or `float` annotation, a layer's size), other methods' parameters as unknown."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from helpers import attention_module

from sdpa_port import Status, Style, port_source
from sdpa_port.analyse.cstutil import code
from sdpa_port.analyse.module_facts import ModuleFacts

BODY = "scores = torch.matmul(query, key.transpose(-1, -2)) * self.scale\nreturn torch.matmul(scores.softmax(-1), value)"
BUILDER = """

class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = Attention(config)
"""

NUMBER = "scale=self.scale"  # SDPA takes the attribute as its scale
QUERY = "sdpa_query = query * self.scale"  # the query is scaled instead
REFUSED = "S102"


def port(init: str, init_params: str = "", methods: str = "") -> str:
    """What the class-style port does with `self.scale`: NUMBER, QUERY, or the refusal's code."""
    source = attention_module(BODY, init=init, helpers=methods, init_params=init_params) + BUILDER
    result = port_source(source, filename="modeling_example.py", style=Style.CLASS)
    if result.status is not Status.PORTED:
        assert result.status is Status.REFUSED, result.reasons
        return ",".join(r.code.value[0] for r in result.refusals)
    ported = result.source[result.source.index("class SdpaAttention") :]
    found = [line.strip().rstrip(",") for line in ported.splitlines() if line.strip().rstrip(",") in (NUMBER, QUERY)]
    assert len(found) == 1, ported
    return found[0]


LAVIS = "head_dim = dim // num_heads\nself.scale = qk_scale or head_dim ** -0.5\n"


@pytest.mark.parametrize(
    "init_params,init,expected",
    [
        # timm's and LAVIS's: `dim` is a layer's size, so an integer; `qk_scale` defaults to None, `or` gives a number
        ("dim, num_heads=8, qk_scale=None", LAVIS + "self.qkv = nn.Linear(dim, dim * 3)", NUMBER),
        ("dim, num_heads=8, qk_scale=None", LAVIS + "self.conv = nn.Conv2d(in_channels=dim, out_channels=8, kernel_size=1)", NUMBER),
        # a layer built on one path only still says what `dim` is
        ("dim, num_heads=8, qk_scale=None, qkv=True", LAVIS + "if qkv:\n    self.qkv = nn.Linear(dim, dim * 3)", NUMBER),
        # nothing says `dim` is a number: `dim // num_heads` of a tensor is a tensor
        ("dim, num_heads=8, qk_scale=None", LAVIS, REFUSED),
        ("dim, num_heads=8, qk_scale=None", LAVIS + "self.norm = nn.LayerNorm(dim)", REFUSED),  # a shape, maybe a tuple
        # a size computed from it: Transformer-XL's `3 * n_head * d_head`; a new tensor's shape; a range
        ("d_model, n_head, d_head", "self.scale = 1 / (d_head ** 0.5)\nself.qkv = nn.Linear(d_model, 3 * n_head * d_head)", NUMBER),
        ("key_dim, heads", "self.scale = key_dim ** -0.5\nself.bias = nn.Parameter(torch.zeros((heads, key_dim)))", NUMBER),
        ("key_dim", "self.scale = key_dim ** -0.5\nself.offsets = [i for i in range(key_dim)]", NUMBER),
        ("key_dim", "self.scale = key_dim ** -0.5\nn = key_dim * 2\nself.norm = nn.BatchNorm1d(n)", NUMBER),
        # not sizes: a tensor's data, a size `int()` makes of a float, a true division
        ("key_dim", "self.scale = key_dim ** -0.5\nself.keys = torch.tensor(key_dim)", REFUSED),
        ("key_dim", "self.scale = key_dim ** -0.5\nself.proj = nn.Linear(int(key_dim * 1.5), 8)", REFUSED),
        ("key_dim", "self.scale = key_dim ** -0.5\nself.proj = nn.Linear(key_dim / 2, 8)", REFUSED),
        # the layer is given `dim` bound again: what it proves is of that value
        ("dim, num_heads=8, qk_scale=None", "dim = dim * 2\n" + LAVIS + "self.qkv = nn.Linear(dim, dim * 3)", REFUSED),
        # declared by a default or an annotation
        ("head_dim=32, qk_scale=None", "self.scale = qk_scale or head_dim ** -0.5", NUMBER),
        ("head_dim=32, qk_scale=0.125", "self.scale = qk_scale or head_dim ** -0.5", NUMBER),
        ("head_dim: int, qk_scale: float | None = None", "self.scale = qk_scale or head_dim ** -0.5", NUMBER),
        ("head_dim: int, qk_scale: Optional[float] = None", "self.scale = qk_scale or head_dim ** -0.5", NUMBER),
        ("head_dim: int, qk_scale: Union[int, float, None] = None", "self.scale = qk_scale or head_dim ** -0.5", NUMBER),
        ("scale: float", "self.scale = scale", NUMBER),
        ("head_dim=32, qk_scale=None", "self.scale = qk_scale if qk_scale is not None else head_dim ** -0.5", NUMBER),
        ("head_dim=32, qk_scale=None", "self.scale = head_dim ** -0.5 if qk_scale is None else qk_scale", NUMBER),
        # None itself is no scale; the test the wrong way round keeps it
        ("head_dim=32, qk_scale=None", "self.scale = qk_scale", REFUSED),
        ("head_dim=32, qk_scale=None", "self.scale = qk_scale if qk_scale is None else head_dim ** -0.5", REFUSED),
        # declared a tensor, or not declared at all
        ("head_dim=32, qk_scale: torch.Tensor | None = None", "self.scale = qk_scale or head_dim ** -0.5", REFUSED),
        ("scale: float = default_scale()", "self.scale = scale", NUMBER),  # the annotation decides
        ("scale=default_scale()", "self.scale = scale", REFUSED),
        ("scale", "self.scale = scale", REFUSED),
        ("scale", "self.scale = scale ** -0.5", REFUSED),
        ("scale", "self.scale = scale or 0.5", REFUSED),
        ("*scales", "self.scale = scales", REFUSED),
        # a parameter bound again before anything else reads it: only that statement reads the argument
        ("in_features, embed_dim: int = None, num_heads=4", "embed_dim = embed_dim or in_features\nself.head_dim = embed_dim // num_heads\nself.scale = self.head_dim ** -0.5\nself.qkv = nn.Linear(in_features, 8)", NUMBER),
        ("head_dim=32, qk_scale=None", "qk_scale = qk_scale or head_dim ** -0.5\nself.scale = qk_scale", NUMBER),
        ("scale", "scale = scale or 0.5\nself.scale = scale", REFUSED),  # the argument is no declared number
        ("head_dim=32, qk_scale=None", "self.given = qk_scale\nqk_scale = qk_scale or 1.0\nself.scale = qk_scale", REFUSED),
        ("head_dim=32, qk_scale=None", "if head_dim:\n    qk_scale = qk_scale or 1.0\nself.scale = qk_scale", REFUSED),
        # numbers in disguise
        ("d", "self.scale = 1 / math.sqrt(d)", NUMBER),  # math.sqrt gives a float, or raises
        ("", "self.scale = math.sqrt(config.head_dim) ** -1", NUMBER),
        # several bindings, each a number
        ("", "if config.qk_norm:\n    self.scale = 1.0\nelse:\n    self.scale = config.head_dim ** -0.5", NUMBER),
        ("scale", "if config.qk_norm:\n    self.scale = 1.0\nelse:\n    self.scale = scale", REFUSED),
        ("", "scale = 1.0\nif config.qk_norm:\n    scale = scale * config.head_dim ** -0.5\nself.scale = scale", NUMBER),
        ("", "for scale in config.scales:\n    pass\nself.scale = scale", REFUSED),  # a loop's target
        ("", "scale, other = config.scales\nself.scale = scale", REFUSED),
        ("", "self.scale = SCALE", REFUSED),  # a global: not followed
        # tensors: one number that needs no gradient; one per head, or learnt, scales the query
        ("", "self.register_buffer('scale', torch.tensor(config.head_dim ** -0.5))", NUMBER),
        ("", "self.scale = nn.Buffer(torch.tensor(config.head_dim ** -0.5))", NUMBER),
        ("", "self.register_buffer('scale', torch.tensor(0.125, requires_grad=True))", REFUSED),
        ("", "self.scale = nn.Parameter(torch.tensor(config.head_dim ** -0.5))", QUERY),
        ("", "self.register_buffer('scale', torch.ones(config.num_heads, 1, 1))", QUERY),
        ("", "per_head = torch.ones(config.num_heads, 1, 1)\nself.scale = per_head", QUERY),
        ("", "per_key = torch.ones(config.num_heads, 1, 8)\nself.scale = per_key", REFUSED),
        ("size=8", "self.scale = nn.Parameter(torch.randn(size))", REFUSED),
    ],
)
def test_a_scale_built_in_init(init_params: str, init: str, expected: str) -> None:
    assert port(init, init_params) == expected


@pytest.mark.parametrize(
    "methods,expected",
    [
        # another method's parameters are what its callers pass, whatever they are declared
        ("def set_scale(self, scale):\n    self.scale = scale", REFUSED),
        ("def set_scale(self, scale: float = 0.5):\n    self.scale = scale", REFUSED),
        ("def sharpen(self, factor):\n    self.scale *= factor", REFUSED),
        ("def swap(self, pair):\n    self.scale, self.other = pair", REFUSED),
        ("def scan(self, scales):\n    for self.scale in scales:\n        pass", REFUSED),
        ("def keep(self, scales):\n    return [0 for self.scale in scales]", REFUSED),
        ("def load(self, path):\n    with open(path) as self.scale:\n        pass", REFUSED),
        ("def set_scale(self, scale):\n    setattr(self, 'scale', scale)", REFUSED),
        ("def reset(self, scale):\n    self.register_buffer('scale', scale)", REFUSED),
        ("def later(self, scale):\n    def inner():\n        self.scale = 0.5\n    return inner", REFUSED),  # not read
        # numbers wherever they are bound: a pruning that counts heads
        ("def prune(self, heads):\n    self.scale = self.scale * len(heads)", NUMBER),
        ("def prune(self, heads):\n    self.scale *= len(heads)", NUMBER),
        ("def halve(self):\n    self.scale = 0.5 * self.config.head_dim ** -0.5", NUMBER),
    ],
)
def test_a_scale_bound_again_in_another_method(methods: str, expected: str) -> None:
    assert port("self.scale = config.head_dim ** -0.5", methods=methods) == expected


def test_a_base_class_binding_counts_too() -> None:
    """The bindings of every class of the file's MRO: a base's method binds the attribute a subclass reads."""
    source = attention_module(BODY, init="self.scale = config.head_dim ** -0.5") + BUILDER
    source = source.replace("class Attention(nn.Module):", "class Attention(Base):")
    base = "class Base(nn.Module):\n    def set_scale(self, scale):\n        self.scale = scale\n\n\n"
    source = source.replace("\n\nclass Attention(", "\n\n" + base + "class Attention(", 1)
    result = port_source(source, filename="modeling_example.py", style=Style.CLASS)
    assert [r.code.value[0] for r in result.refusals] == [REFUSED], result.reasons


BINDINGS = '''
class A(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.plain = config.x
        self.register_buffer("buffer", torch.tensor(1.0))

    def grow(self, n):
        self.plain += n

    def unpack(self, pair):
        self.first, (self.second, *self.rest) = pair

    def loops(self, items, path):
        for self.item in items:
            pass
        with open(path) as self.handle:
            pass
        return [0 for self.comprehended in items]

    def dynamic(self, value):
        setattr(self, "set", value)

    def nested(self):
        def inner():
            self.inner = 1
        return inner
'''


def test_every_statement_that_binds_an_attribute_is_a_binding() -> None:
    """Bindings the `ast` screen must send the collector to (augmented, unpacked, targets, setattr), each with its
    method, and the value where it is a value of that method."""
    module = cst.parse_module(textwrap.dedent(BINDINGS))
    facts = ModuleFacts.of(module, ast.parse(textwrap.dedent(BINDINGS)))

    def bound(name: str) -> list[tuple[str, str | None]]:
        return [
            (b.method.name.value, None if b.value is None else code(b.value))
            for b in facts.find_attribute_bindings("A", name)
        ]

    assert bound("plain") == [("__init__", "config.x"), ("grow", "self.plain + n")]
    assert bound("buffer") == [("__init__", "torch.tensor(1.0)")]
    for name, method in [
        ("first", "unpack"),
        ("second", "unpack"),
        ("rest", "unpack"),
        ("item", "loops"),
        ("handle", "loops"),
        ("comprehended", "loops"),
        ("inner", "nested"),
    ]:
        assert bound(name) == [(method, None)], name
    assert bound("set") == [("dynamic", "value")]


LEVIT = """
class Projection(nn.Module):
    def __init__(self, input_dim, output_dim, bias=False):
        super().__init__()
        self.linear = nn.Linear(in_features=input_dim, out_features=output_dim, bias=bias)

"""


@pytest.mark.parametrize(
    "init,expected",
    [
        # LeViT's: `key_dim` reaches a layer of the file through an attribute
        ("self.n = ratio * key_dim * heads + key_dim * heads * 2\nself.qkv = Projection(hidden, self.n)", NUMBER),
        ("self.qkv = Projection(hidden, output_dim=key_dim * heads)", NUMBER),
        # the argument the module takes as no size
        ("self.qkv = Projection(hidden, 8, key_dim)", REFUSED),
        ("self.qkv = Projection(hidden, 8, bias=key_dim)", REFUSED),
    ],
)
def test_a_size_given_to_a_module_of_the_file(init: str, expected: str) -> None:
    source = attention_module(
        BODY, init="self.scale = key_dim ** -0.5\n" + init, init_params="hidden, key_dim, heads=4, ratio=2"
    )
    source = source.replace("\n\nclass Attention(", "\n\n" + LEVIT + "\nclass Attention(", 1) + BUILDER
    result = port_source(source, filename="modeling_example.py", style=Style.CLASS)
    if result.status is Status.REFUSED:
        assert ",".join(r.code.value[0] for r in result.refusals) == expected, result.reasons
    else:
        assert result.status is Status.PORTED and expected == NUMBER and NUMBER in result.source, result.reasons


SPACE = (
    "self.num_heads = num_heads\nself.head_dim = hidden_dim // num_heads\nself.scale = self.head_dim ** -0.5\n"
    "self.qkv = nn.Linear(hidden_dim, hidden_dim * 3)"
)
SPLIT = "def split(self, x):\n    return x.reshape(x.size(0), x.size(1), {}, -1)"


@pytest.mark.parametrize(
    "init,methods,expected",
    [
        # modelscope's SPACE: `num_heads` reaches no layer, only the views of the methods, through `self.num_heads`
        (SPACE, SPLIT.format("self.num_heads"), NUMBER),
        (SPACE, "def split(self, x):\n    return x.view((x.size(0), x.size(1), self.num_heads, -1))", NUMBER),
        (SPACE, "def heads(self, mask):\n    return mask.repeat(1, self.num_heads, 1, 1)", NUMBER),
        (SPACE, "def heads(self, mask):\n    return mask[:, None].expand(-1, self.num_heads * 2, -1, -1)", NUMBER),
        # the head size as a view's size: both operands of `hidden_dim // num_heads` are integers
        (SPACE.replace("hidden_dim * 3", "8"), "def split(self, x):\n    return x.view(2, 3, -1, self.head_dim)", NUMBER),
        # nothing says `num_heads` is an integer: `hidden_dim // num_heads` of a tensor is a tensor
        (SPACE, "", REFUSED),
        (SPACE, SPLIT.format("self.num_heads / 1"), REFUSED),  # a true division makes no integer size
        (SPACE, SPLIT.format("int(self.num_heads)"), REFUSED),  # `int()` makes one of anything
        (SPACE, "def split(self, x):\n    return x.view(self.num_heads)", REFUSED),  # `view(dtype)`
        # a function of a module, not a tensor's method: its first argument is no size
        (SPACE, "def copies(self, n):\n    return itertools.repeat(self.num_heads, n)", REFUSED),
        # bound again elsewhere: the view reads that value, not the argument
        (SPACE, SPLIT.format("self.num_heads") + "\n\ndef prune(self, n):\n    self.num_heads = n", REFUSED),
    ],
)
def test_a_size_given_to_a_view_in_a_method(init: str, methods: str, expected: str) -> None:
    assert port(init, "hidden_dim, num_heads", methods) == expected
