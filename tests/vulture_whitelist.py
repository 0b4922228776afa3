"""Names the unused-code check (vulture, in the unit session) cannot see being used.

- enum members that typer offers as command-line choices;
- functions of `sdpa_port/verify/checks.py` that emitted parity tests call (the file travels into them as text);
- enum members built from the source's text (`KeepAction(attribute.attr.value)`);
- what libcst and transformers read: visitor metadata declarations, generation-config fields.
"""

from sdpa_port.analyse.trace import KeepAction
from sdpa_port.bench.options import Clock, Malloc, Padding
from sdpa_port.plan.threading import _CallFinder
from sdpa_port.verify import checks
from sdpa_port.verify.stubs import StandInModule, _Finder, _StandType

KeepAction.DTYPE
KeepAction.DEVICE
KeepAction.TYPE

Clock.WALL
Malloc.DEFAULT
Padding.LEFT
Padding.RIGHT
checks.without_dropout
checks.sdpa_backends
checks.gradients
checks.gradient_difference
_CallFinder.METADATA_DEPENDENCIES
_.use_cache  # generation_config fields transformers' static-cache export reads
_.cache_implementation
_.cache_config
StandInModule.__path__  # a package to the import system: its submodules are stand-ins too
_Finder.create_module  # importlib's Loader protocol
_StandType.__getattr__  # Python calls it for a class attribute the stand-in class lacks
# flash-attn's parameters that the flash stand-in takes and ignores (transformers reads the kernels' signatures), and
# `PreTrainedModel._flash_attn_can_dispatch`'s, which the flash path replaces
_.deterministic
_.return_attn_probs
_.is_init_check
