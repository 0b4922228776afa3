"""Config classes rebuilt at a size level, with their nested configs and the flags that switch attention on."""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

from sdpa_port.verify.configs import Level, level_kwargs


def timm_available() -> bool:
    try:
        from transformers.utils import is_timm_available
    except ImportError:
        return False
    return bool(is_timm_available())


def config_at(config_class: type, level: Level) -> Any:
    """The config class rebuilt at `level`, twice where the constructor builds sub-configs.

    A constructor may create sub-configs (a default backbone) that only then can be shrunk.
    """
    config = config_class()
    kwargs: dict[str, Any] = {}
    for _ in range(2):
        changes = level_kwargs(config.to_dict(), level, timm_available())
        if not changes:
            break
        kwargs = {**kwargs, **changes}
        try:
            config = config_class(**kwargs)
        except Exception:
            config = config_class()
            for name, value in kwargs.items():
                if not isinstance(value, dict):
                    setattr(config, name, value)
        for name, value in kwargs.items():  # fields the constructor ignored
            if value is None and hasattr(getattr(config, name, None), "to_dict"):
                continue  # a sub-config the constructor built in place of None (a default backbone)
            if not isinstance(value, dict) and getattr(config, name, None) != value:
                with contextlib.suppress(Exception):
                    setattr(config, name, value)
    return config


def sub_configs(config: Any) -> Iterator[tuple[str, Any]]:
    """Every nested config with its dotted path."""
    base = _config_base()
    seen = {id(config)}
    stack = [("", config)]
    while stack:
        prefix, current = stack.pop()
        for name, value in list(vars(current).items()):
            if isinstance(value, base) and id(value) not in seen:
                seen.add(id(value))
                path = f"{prefix}{name}"
                yield path, value
                stack.append((f"{path}.", value))


def _config_base() -> type:
    import transformers

    return getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig


def attention_flags(config: Any) -> list[str]:
    """Boolean config fields that switch attention on and are off, such as `self_attn`, top level first."""
    names = []
    for name, value in sorted(config.to_dict().items()):
        if value is False and re.search(r"(^|_)(self_)?att(n|ention)($|_)", name) and "output" not in name:
            names.append(name)
    return names
