"""Why a file is not ported: one refusal type with stable codes, as linters number their rules.

A code names a class of reasons (a family letter per stage, then a number); the detail of a refusal says what
exactly blocks the port and where. `docs/refusals.md` documents every code with a minimal example, and a test
checks each example still produces its code.

Families: S the score chain, M masks, C causality, W wiring (how the module is built and selected), A the file's
authors, F forms the tool does not recognise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Code(enum.Enum):
    """Every refusal code, with its one-line title."""

    # S: the eager computation from the query-key product to the product with the values
    SCORES_TRANSFORMED = ("S101", "the scores pass through an operation SDPA has no equivalent for")
    SCALE_NOT_A_NUMBER = ("S102", "the scores are scaled by something not provably a number")
    SCORES_COMBINED = ("S103", "the scores are combined with a tensor other than by adding it")
    SCORES_READ = ("S104", "the scores are read outside the computation, or decide a term added to them")
    SOFTMAX_DIM = ("S105", "the softmax does not run over the key dimension")
    PROBABILITIES_CHANGED = ("S106", "the probabilities are changed after the softmax")
    UNKNOWN_PRODUCT = ("S107", "the scores do not come from a recognised query-key product")
    LAYOUT = ("S108", "the layout of the scores cannot be told")
    REPEATED = ("S109", "the attention is computed in a loop, a try block, or more than once")
    CONDITIONAL = ("S110", "a step of the computation happens only under a condition SDPA cannot follow")
    VALUE_SIDE = ("S111", "the probabilities are used beyond the product with the values")
    DROPOUT = ("S112", "dropout is applied where SDPA's dropout_p cannot reproduce it")
    # M: masks
    FILL_VALUE = ("M201", "masked scores are set to a value that does not mask them out")
    MASKED_ROWS = ("M202", "a row whose every key is masked would come out differently")
    MASK_PER_IMPLEMENTATION = ("M203", "the mask is applied with a masking fill, but transformers builds it per implementation")
    MASK_EXTENDED = ("M204", "the mask is extended in the module, but transformers builds it per implementation")
    TERMS_IN_MASK = ("M205", "the additive terms ride on the mask, but the file claims implementations taking another")
    MASK_READ = ("M206", "the module reads its mask itself, but the masks reaching it cannot be given eager's form")
    # C: causality
    CAUSAL_BY_USE = ("C301", "whether the module is causal depends on where it is used")
    CAUSAL_PINNED = ("C302", "the module is built with a literal is_causal=True")
    TOWERS = ("C303", "token and pixel/audio towers share the module's file")
    CAUSAL_CONTRADICTED = ("C304", "the module's own is_causal contradicts the masks the file builds for it")
    # W: wiring
    NO_CONFIG = ("W401", "the attention module is built where no config is in scope")
    SELECTION_KEY = ("W402", "the implementation is selected by something other than config._attn_implementation")
    HEAD_MASK_INTERFACE = ("W403", "an argument only eager can use (a head mask) cannot pass through the attention interface")
    HELPER_CALL = ("W404", "the attention helper is called in a way that cannot be inlined")
    EAGER_FUNCTION = ("W405", "the eager function the module dispatches to is not recognised")
    ALWAYS_WEIGHTS = ("W406", "every call of the attention module asks for its weights, so SDPA would never run")
    BUILT_ELSEWHERE = ("W407", "the attention module is built in another file, where its SDPA class cannot be selected")
    SDPA_SIDE_UNBUILT = ("W408", "the module is built only where a test of its settings takes the side that stays eager")
    SELECTION_OVERRIDDEN = ("W409", "the file sets the implementation or the classes it selects, so sdpa may not build the SDPA class")
    INLINE_SUBCLASS = ("W410", "a subclass would inherit the in-place SDPA forward and changes what it reads")
    CLOSURE_READS = ("W411", "a function forward defines computes the attention, and what it reads may change before a call")
    # A: the file's authors
    AUTHORS_OFF = ("A501", "the file's authors set _supports_sdpa = False")
    # F: forms the tool does not recognise
    UNRECOGNISED = ("F601", "eager attention is present, but its form is not recognised")
    NOT_EXTRACTABLE = ("F602", "the computation cannot be moved into an eager attention function")

    def __init__(self, code: str, title: str) -> None:
        self.code = code
        self.title = title

    @classmethod
    def by_code(cls, code: str) -> "Code":
        for member in cls:
            if member.code == code:
                return member
        raise KeyError(code)


@dataclass(frozen=True)
class Reason:
    """A code and what exactly blocks the port, before it is placed in a class and on a line."""

    code: Code
    detail: str


@dataclass(frozen=True)
class Refusal:
    """Why a computation that looks like attention cannot be ported exactly."""

    code: Code
    where: str  # the class (or function) concerned
    line: int  # 0 when no single line is to blame
    detail: str
    # the class style's refusal stands for the file only because the class cannot stay eager beside the ported ones
    # (`plan/kept_eager.py`): the inline style, which changes no mask, leaves it eager
    beside: bool = False

    def __str__(self) -> str:
        place = f"{self.where} (line {self.line})" if self.line else self.where
        return f"{place}: {self.detail} [{self.code.code}]"

    @classmethod
    def of(cls, reason: Reason, where: str, line: int = 0) -> "Refusal":
        return cls(reason.code, where, line, reason.detail)


class Refuse(Exception):
    """Raised while planning (and only there) to abandon a port; the plan stage turns it into a refused result.

    Rewriting code that finds the chain inexpressible raises it with a code and a detail; the planner, which knows
    the class and line, places it.
    """

    def __init__(self, code: Code, detail: str, where: str | None = None, line: int = 0) -> None:
        super().__init__(detail)
        self.reason = Reason(code, detail)
        self.where = where
        self.line = line

    @classmethod
    def because(cls, reason: Reason, where: str | None = None, line: int = 0) -> "Refuse":
        return cls(reason.code, reason.detail, where, line)

    def placed(self, where: str, line: int = 0) -> Refusal:
        return Refusal(self.reason.code, self.where or where, self.line or line, self.reason.detail)


__all__ = ["Code", "Reason", "Refusal", "Refuse"]
