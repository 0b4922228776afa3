"""The model classes of a file whose forward the harness can feed, best first."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from sdpa_port.verify.configs import config_class_of
from sdpa_port.verify.errors import short_error
from sdpa_port.verify.inputs import ConfigView, Unsupported, describe, plan_inputs


@dataclass
class Candidate:
    original: type
    ported: type
    config_class: type
    kinds: tuple[str, ...]
    index: int

    @property
    def name(self) -> str:
        return self.original.__name__

    def rank(self) -> tuple[int, int, int]:
        name = self.name
        base = name.endswith("Model") and "For" not in name and "LMHead" not in name
        return (len(self.kinds), int(base), -self.index)


def candidates(original: ModuleType, ported: ModuleType, classes: list[type]) -> tuple[list[Candidate], list[str]]:
    """Classes whose forward the harness can feed, best first, and why the others cannot be fed."""
    found: list[Candidate] = []
    reasons: list[str] = []
    for index, klass in enumerate(classes):
        config_class = config_class_of(klass)
        port_class = getattr(ported, klass.__name__, None)
        if config_class is None or port_class is None:
            continue
        try:
            view = ConfigView.of(config_class().to_dict())
        except Exception as error:  # a config that needs arguments
            reasons.append(f"{klass.__name__}: config {config_class.__name__}() failed: {short_error(error)}")
            continue
        plans = plan_inputs(describe(klass.forward), view)
        if isinstance(plans, Unsupported):
            reasons.append(f"{klass.__name__}: {plans.reason}")
            continue
        found.append(Candidate(klass, port_class, config_class, plans[0].kinds, index))
    found.sort(key=Candidate.rank, reverse=True)
    return found, reasons


def model_classes(module: ModuleType) -> list[type]:
    """PreTrainedModel subclasses defined in the module, in definition order."""
    from transformers import PreTrainedModel

    out = []
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, PreTrainedModel)
            and value.__module__ == module.__name__
            and not value.__name__.endswith("PreTrainedModel")
        ):
            out.append(value)
    return out
