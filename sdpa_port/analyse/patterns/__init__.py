"""Named structural patterns: the call forms eager attention is written with.

Every recogniser takes CST nodes and a `Scope` (what names and `self.` attributes mean) and returns a small typed
description or None. Nothing here looks at source text. Each module holds one job: `functions` (the qualified names
of the calls), `calls` (arguments and methods), `numbers`, `scalars`, `factors`, `softmax`, `dropout`,
`conditions`, `products`, `einsum` and `layouts`; this package re-exports them all, read as `patterns.X`.
"""

from __future__ import annotations

from sdpa_port.analyse.patterns.functions import (
    SOFTMAX_FUNCTIONS,
    SOFTMAX_MODULES,
    DROPOUT_FUNCTIONS,
    DROPOUT_MODULES,
    MATMUL_FUNCTIONS,
    BADDBMM_FUNCTIONS,
    EINSUM_FUNCTIONS,
    SIZED_FACTORIES,
    WHERE_FUNCTIONS,
    MAXIMUM_FUNCTIONS,
    CAT_FUNCTIONS,
    ZEROS_FUNCTIONS,
    SCALAR_TENSOR_FUNCTIONS,
    SCALAR_FUNCTIONS,
    NUMBER_FUNCTIONS,
    PLACING_KEYWORDS,
    SCALAR_KEEPING_METHODS,
    CAST_METHODS,
    RESHAPE_METHODS,
    DTYPE_CASTS,
    ELEMENTWISE_FUNCTIONS,
    ELEMENTWISE_METHODS,
    FILLED_TENSOR_FUNCTIONS,
    SHAPE_KEEPING_FUNCTIONS,
    PARAMETER_WRAPPERS,
    INFINITIES,
)
from sdpa_port.analyse.patterns.calls import (
    is_self,
    Scope,
    arg,
    has_star_args,
    method_call,
    self_attribute_name,
    reshape_args,
    cast_operand,
)
from sdpa_port.analyse.patterns.numbers import (
    VERY_NEGATIVE_LIMIT,
    ABSORBING_LIMIT,
    FINFO_MIN,
    number,
    is_very_negative,
    is_absorbing,
    is_minus_infinity,
    fill_number,
)
from sdpa_port.analyse.patterns.scalars import (
    Scalar,
    scalar,
    MethodScope,
)
from sdpa_port.analyse.patterns.factors import (
    constant_along_last,
)
from sdpa_port.analyse.patterns.softmax import (
    SoftmaxForm,
    SoftmaxCall,
    softmax_call,
)
from sdpa_port.analyse.patterns.dropout import (
    DropoutCall,
    dropout_call,
    guarded_dropout,
)
from sdpa_port.analyse.patterns.conditions import (
    reads_settings_only,
    conjuncts,
    joined,
    optional_module_test,
)
from sdpa_port.analyse.patterns.products import (
    ProductForm,
    Product,
    product,
)
from sdpa_port.analyse.patterns.einsum import (
    einsum_spec,
    EinsumRole,
    EinsumRoles,
    einsum_roles,
)
from sdpa_port.analyse.patterns.layouts import (
    Order,
    permuted,
    then,
    inverse,
    least_rank,
    transposed_last_two,
    features_second_last,
)
from sdpa_port.analyse.cstutil import function_names, walk_names  # read as `patterns.function_names` too

__all__ = [
    "ABSORBING_LIMIT",
    "BADDBMM_FUNCTIONS",
    "CAST_METHODS",
    "CAT_FUNCTIONS",
    "DROPOUT_FUNCTIONS",
    "DROPOUT_MODULES",
    "DTYPE_CASTS",
    "DropoutCall",
    "EINSUM_FUNCTIONS",
    "ELEMENTWISE_FUNCTIONS",
    "ELEMENTWISE_METHODS",
    "EinsumRole",
    "EinsumRoles",
    "FILLED_TENSOR_FUNCTIONS",
    "FINFO_MIN",
    "INFINITIES",
    "MethodScope",
    "MATMUL_FUNCTIONS",
    "MAXIMUM_FUNCTIONS",
    "NUMBER_FUNCTIONS",
    "Order",
    "PARAMETER_WRAPPERS",
    "PLACING_KEYWORDS",
    "Product",
    "ProductForm",
    "RESHAPE_METHODS",
    "SCALAR_FUNCTIONS",
    "SCALAR_KEEPING_METHODS",
    "SCALAR_TENSOR_FUNCTIONS",
    "SHAPE_KEEPING_FUNCTIONS",
    "SIZED_FACTORIES",
    "SOFTMAX_FUNCTIONS",
    "SOFTMAX_MODULES",
    "Scalar",
    "Scope",
    "SoftmaxCall",
    "SoftmaxForm",
    "VERY_NEGATIVE_LIMIT",
    "WHERE_FUNCTIONS",
    "ZEROS_FUNCTIONS",
    "arg",
    "cast_operand",
    "conjuncts",
    "constant_along_last",
    "dropout_call",
    "einsum_roles",
    "einsum_spec",
    "features_second_last",
    "fill_number",
    "function_names",
    "guarded_dropout",
    "has_star_args",
    "inverse",
    "is_absorbing",
    "is_minus_infinity",
    "is_self",
    "is_very_negative",
    "joined",
    "least_rank",
    "method_call",
    "number",
    "optional_module_test",
    "permuted",
    "product",
    "reads_settings_only",
    "reshape_args",
    "scalar",
    "self_attribute_name",
    "softmax_call",
    "then",
    "transposed_last_two",
    "walk_names",
]
