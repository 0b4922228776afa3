"""A long-lived timing process driven over stdin/stdout, for lockstep comparisons across environments.

    python -m sdpa_port.bench.worker

Reads one JSON request per line and answers one JSON line each:

    {"op": "setup", "target": "bert", "settings": {...}, "length": 1024, "phase": "forward", "out_dir": "..."}
        -> {"model": {...}, "target": {...}, "environment": {...}, "check": float}
    {"op": "time", "implementation": "eager"}  -> {"wall": seconds, "cpu": seconds}   (one timed call)
    {"op": "quit"}

Two workers, one per transformers environment, let a driver time the four (side, implementation) pairs in turns, so
every round of a comparison meets the same background load on all four.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from sdpa_port.bench.spec import Kind, Phase, Settings, Size


def settings_from(data: dict[str, Any]) -> Settings:
    raw = dict(data)
    raw["lengths"] = tuple(raw.get("lengths", ()))
    raw["devices"] = tuple(raw.get("devices", ("cpu",)))
    raw["phases"] = tuple(raw.get("phases", ("forward",)))
    raw["size"] = Size(**raw.get("size", {}))
    return Settings(**raw)


class Worker:
    def __init__(self) -> None:
        self.timed: dict[str, Any] = {}
        self.device = "cpu"

    def setup(self, request: dict[str, Any]) -> dict[str, Any]:
        import torch

        from sdpa_port.bench import measure
        from sdpa_port.bench.environment import describe
        from sdpa_port.bench.run import apply_malloc, describe_model
        from sdpa_port.bench.target import prepare

        settings = settings_from(request["settings"])
        torch.set_num_threads(settings.threads)
        allocator = apply_malloc(settings.malloc)
        length, phase = int(request["length"]), Phase(request.get("phase", "forward"))
        prepared = prepare(request["target"], Path(request["out_dir"]), request.get("package"))
        kind = Kind(request["kind"]) if request.get("kind") else None
        ref, chosen = describe_model(prepared, settings, request.get("model_class"), kind)
        config = measure.build_config(chosen, ref.config)
        eager = measure.build_model(chosen, config, "eager", self.device, settings.seed, settings.dtype)
        sdpa = measure.build_model(chosen, config, "sdpa", self.device, settings.seed, settings.dtype)
        sdpa.load_state_dict(eager.state_dict())
        inputs = measure.make_inputs(config, ref.kind, settings, length, self.device)
        check = measure.output_difference(eager, sdpa, inputs, ref.kind)
        self.timed = {
            "eager": measure.prepare_phase(eager, inputs, ref.kind, phase, settings),
            "sdpa": measure.prepare_phase(sdpa, inputs, ref.kind, phase, settings),
        }
        target = prepared.describe() | {"model_class": ref.model_class, "kind": ref.kind.value}
        environment = describe(settings.threads) | {"malloc": allocator}
        return {"model": ref.to_json(), "target": target, "environment": environment, "check": check}

    def time(self, request: dict[str, Any]) -> dict[str, Any]:
        import torch

        entry = self.timed[request["implementation"]]
        with torch.inference_mode():
            if entry.before is not None:
                entry.before()
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            entry.run()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return {"wall": wall / entry.per, "cpu": cpu / entry.per}


def serve(requests: TextIO, answers: TextIO) -> None:
    worker = Worker()
    for line in requests:
        request = json.loads(line)
        if request["op"] == "quit":
            break
        try:
            answer = worker.setup(request) if request["op"] == "setup" else worker.time(request)
        except Exception as error:  # reported to the driver, which decides
            answer = {"error": f"{type(error).__name__}: {error}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def main() -> None:
    answers = sys.stdout
    sys.stdout = sys.stderr  # whatever libraries print must not interleave with the answers
    serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
