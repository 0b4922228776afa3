"""The functions, modules and methods eager attention is written with, by qualified name."""

from __future__ import annotations

# ------------------------------------------------------------------ the steps of attention

SOFTMAX_FUNCTIONS = frozenset({"torch.nn.functional.softmax", "torch.softmax", "torch.Tensor.softmax"})
SOFTMAX_MODULES = frozenset({"torch.nn.Softmax"})
DROPOUT_FUNCTIONS = frozenset({"torch.nn.functional.dropout", "torch.dropout"})
DROPOUT_MODULES = frozenset({"torch.nn.Dropout"})
MATMUL_FUNCTIONS = frozenset({"torch.matmul", "torch.bmm"})
BADDBMM_FUNCTIONS = frozenset({"torch.baddbmm"})
EINSUM_FUNCTIONS = frozenset({"torch.einsum"})
WHERE_FUNCTIONS = frozenset({"torch.where"})
MAXIMUM_FUNCTIONS = frozenset({"torch.max", "torch.maximum", "torch.clamp", "torch.clamp_min"})
CAT_FUNCTIONS = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})

# ------------------------------------------------------------------ tensors made

# tensor factories whose positional arguments are the sizes (`torch.randn(heads, dim)`, `torch.zeros((n, d))`)
SIZED_FACTORIES = frozenset(
    f"torch.{name}" for name in ("zeros", "ones", "randn", "rand", "empty", "Tensor", "FloatTensor", "HalfTensor")
)
ZEROS_FUNCTIONS = frozenset({"torch.zeros", "torch.empty", "torch.zeros_like", "torch.empty_like"})
FILLED_TENSOR_FUNCTIONS = frozenset({"torch.ones", "torch.zeros", "torch.full", "torch.rand", "torch.randn", "torch.empty"})
PARAMETER_WRAPPERS = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})
BUFFER_WRAPPERS = frozenset({"torch.nn.Buffer", "torch.nn.parameter.Buffer"})

# ------------------------------------------------------------------ numbers

SCALAR_TENSOR_FUNCTIONS = frozenset({"torch.full", "torch.tensor", "torch.as_tensor", "torch.scalar_tensor"})
SCALAR_FUNCTIONS = frozenset(
    {
        "math.sqrt", "math.pow", "math.log", "math.exp", "float", "int", "abs", "min", "max", "numpy.sqrt", "np.sqrt",
        # on numbers (0-d tensors), the same numbers: `torch.sqrt(torch.tensor(head_dim, dtype=torch.float32))`
        "torch.sqrt", "torch.rsqrt", "torch.pow", "torch.exp", "torch.log",
    }
)
# functions whose result is a Python number whatever they are given (or they raise): math.sqrt(n) of any n
NUMBER_FUNCTIONS = frozenset({"math.sqrt", "math.pow", "math.log", "math.exp", "float", "int"})
# keywords that place or type a number without changing it
PLACING_KEYWORDS = frozenset({"dtype", "device", "requires_grad"})
# methods of a 0-d tensor that keep its number: dtype casts, moves and reading it out
SCALAR_KEEPING_METHODS = frozenset({"to", "type", "type_as", "float", "double", "half", "bfloat16", "item", "detach"})
INFINITIES = frozenset({"math.inf", "torch.inf", "numpy.inf", "np.inf"})

# ------------------------------------------------------------------ shapes and dtypes

CAST_METHODS = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double", "contiguous"})
RESHAPE_METHODS = frozenset({"view", "reshape"})
DTYPE_CASTS = frozenset({"to", "type", "type_as"})
# elementwise functions of one tensor: the result has the operand's shape
ELEMENTWISE_FUNCTIONS = frozenset(
    {"torch.clamp", "torch.clip", "torch.exp", "torch.log", "torch.sqrt", "torch.rsqrt", "torch.sigmoid", "torch.abs"}
)
ELEMENTWISE_METHODS = frozenset({"clamp", "clip", "exp", "log", "sqrt", "rsqrt", "sigmoid", "abs"}) | CAST_METHODS
# functions whose result has the shape of their first argument
SHAPE_KEEPING_FUNCTIONS = ELEMENTWISE_FUNCTIONS | {"torch.nn.functional.normalize", "torch.nn.functional.layer_norm"}
