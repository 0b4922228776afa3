"""What a benchmark run is asked to do and what it found: plain data, JSON in and out, no torch."""

from __future__ import annotations

import enum
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_LENGTHS = (512, 1024, 2048, 4096)
IMPLEMENTATIONS = ("eager", "sdpa")
MAX_ROUNDS = 200


class Kind(str, enum.Enum):
    ENCODER = "encoder"
    DECODER = "decoder"
    SEQ2SEQ = "seq2seq"


class Phase(str, enum.Enum):
    FORWARD = "forward"  # one pass over L tokens, no cache
    PREFILL = "prefill"  # one pass over L tokens that fills the cache (decoders)
    DECODE = "decode"  # one new token against a cache of L tokens, per token (decoders)


@dataclass(frozen=True)
class Size:
    """The mid-sized random-init configuration the benchmark builds."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    ffn: int = 1024
    vocab: int = 1000


@dataclass(frozen=True)
class Settings:
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    runs: int = 5
    warmup: int = 1
    min_time: float = 0.0  # keep timing rounds past `runs` until this many seconds were timed (at most MAX_ROUNDS)
    threads: int = 1
    clock: str = "cpu"  # cpu: process CPU time (one thread, robust to other processes) | wall
    malloc: str = "steady"  # steady: fixed glibc thresholds in the timing process (see bench.malloc) | default
    batch: int = 1
    padding: str = "none"  # none | left | right | auto (left for decoders, right otherwise)
    pad_fraction: float = 0.25  # share of the last example that is padding, when padded
    dtype: str = "float32"  # the models' dtype: float32 or bfloat16
    decode_tokens: int = 8
    devices: tuple[str, ...] = ("cpu",)
    memory: bool = True
    phases: tuple[str, ...] = ("forward", "prefill", "decode")  # those that apply to the model's kind are run
    size: Size = field(default_factory=Size)
    seed: int = 0
    # decoders: also time the SDPA model exported with a static cache, lowered to XNNPACK, run by ExecuTorch
    executorch: bool = False

    def padding_side(self, kind: Kind) -> str:
        if self.padding != "auto":
            return self.padding
        return "left" if kind is Kind.DECODER else "right"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ModelRef:
    """How to load the model being measured, in this process or a child: an importable module or a file."""

    module: str | None  # importable name of an installed module, or None when loaded from `path`
    path: str | None  # a (ported) file loaded inside `package`
    package: str
    model_class: str
    config: dict[str, Any]  # keyword arguments of the config class
    kind: Kind

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = self.kind.value
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> "ModelRef":
        return ModelRef(
            module=data["module"],
            path=data["path"],
            package=data["package"],
            model_class=data["model_class"],
            config=dict(data["config"]),
            kind=Kind(data["kind"]),
        )


@dataclass(frozen=True)
class Timing:
    """Seconds per call, one sample per timed round, on both clocks."""

    wall: tuple[float, ...]
    cpu: tuple[float, ...]

    @property
    def wall_s(self) -> float:
        return min(self.wall)

    @property
    def cpu_s(self) -> float:
        return min(self.cpu)

    def samples(self, clock: str) -> tuple[float, ...]:
        return self.cpu if clock == "cpu" else self.wall


def paired_speedup(eager: Timing, sdpa: Timing, clock: str) -> float:
    """The median over rounds of eager time over SDPA time within each round.

    Calls that ran next to each other saw the same background load, so their ratio drifts less with it than the ratio
    of two minima does.
    """
    return statistics.median(e / s for e, s in zip(eager.samples(clock), sdpa.samples(clock)))


@dataclass(frozen=True)
class Row:
    """One device, phase and length: the best latency of each implementation and, for `forward`, peak memory."""

    device: str
    phase: Phase
    length: int
    eager_s: float
    sdpa_s: float
    eager_peak_bytes: int | None = None
    sdpa_peak_bytes: int | None = None
    eager_wall_s: float | None = None  # wall-clock minimum, kept next to the CPU-time minimum
    sdpa_wall_s: float | None = None
    paired_speedup: float | None = None  # median over rounds of eager/SDPA time within a round
    rounds: int | None = None  # timed rounds behind the minima
    executorch_s: float | None = None  # the exported SDPA model run from its .pte (wall time; prefill and decode)

    @property
    def speedup(self) -> float:
        return self.eager_s / self.sdpa_s

    @property
    def memory_ratio(self) -> float | None:
        if not self.eager_peak_bytes or self.sdpa_peak_bytes is None:
            return None
        return self.sdpa_peak_bytes / self.eager_peak_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "phase": self.phase.value,
            "length": self.length,
            "eager_s": self.eager_s,
            "sdpa_s": self.sdpa_s,
            "speedup": self.speedup,
            "eager_peak_bytes": self.eager_peak_bytes,
            "sdpa_peak_bytes": self.sdpa_peak_bytes,
            "memory_ratio": self.memory_ratio,
            "eager_wall_s": self.eager_wall_s,
            "sdpa_wall_s": self.sdpa_wall_s,
            "paired_speedup": self.paired_speedup,
            "rounds": self.rounds,
            "executorch_s": self.executorch_s,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> "Row":
        return Row(
            device=data["device"],
            phase=Phase(data["phase"]),
            length=int(data["length"]),
            eager_s=float(data["eager_s"]),
            sdpa_s=float(data["sdpa_s"]),
            eager_peak_bytes=data.get("eager_peak_bytes"),
            sdpa_peak_bytes=data.get("sdpa_peak_bytes"),
            eager_wall_s=data.get("eager_wall_s"),
            sdpa_wall_s=data.get("sdpa_wall_s"),
            paired_speedup=data.get("paired_speedup"),
            rounds=data.get("rounds"),
            executorch_s=data.get("executorch_s"),
        )


@dataclass(frozen=True)
class BenchResult:
    target: dict[str, Any]  # what was measured: file, port status, model class, kind
    environment: dict[str, Any]  # versions, CPU, threads
    settings: Settings
    model: ModelRef
    rows: tuple[Row, ...]
    checks: dict[str, Any] = field(default_factory=dict)  # eager against SDPA output at the shortest length

    def row(self, device: str, phase: Phase | str, length: int) -> Row | None:
        for row in self.rows:
            if row.device == device and row.phase == Phase(phase) and row.length == length:
                return row
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "environment": self.environment,
            "settings": self.settings.to_json(),
            "model": self.model.to_json(),
            "checks": self.checks,
            "rows": [row.to_json() for row in self.rows],
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> "BenchResult":
        raw = dict(data["settings"])
        raw["lengths"] = tuple(raw["lengths"])
        raw["devices"] = tuple(raw["devices"])
        raw["phases"] = tuple(raw.get("phases", ("forward", "prefill", "decode")))
        raw["size"] = Size(**raw["size"])
        return BenchResult(
            target=data["target"],
            environment=data["environment"],
            settings=Settings(**raw),
            model=ModelRef.from_json(data["model"]),
            rows=tuple(Row.from_json(row) for row in data["rows"]),
            checks=data.get("checks", {}),
        )
