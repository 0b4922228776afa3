"""One peak-memory measurement in a fresh process.

Run as `python -m sdpa_port.bench.child < request.json`.

The child builds the model and the inputs, runs one warm-up pass on the same inputs (so buffers that libraries allocate
once and keep, such as BLAS workspaces, are in the baseline), then resets the kernel's peak-RSS mark
(`/proc/self/clear_refs`), notes the resident size, runs the measured pass and reports the peak above that baseline:
the memory the pass itself needed. On CUDA it reports torch's peak allocated bytes above the baseline. Prints one JSON
object on stdout.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(request: dict[str, Any]) -> dict[str, Any]:
    import torch

    from sdpa_port.bench import measure as m
    from sdpa_port.bench.spec import Kind, ModelRef, Phase, Settings

    ref = ModelRef.from_json(request["model"])
    settings = Settings(
        batch=request["batch"], padding=request["padding"], pad_fraction=request["pad_fraction"], seed=request["seed"]
    )
    device, length, implementation = request["device"], int(request["length"]), request["implementation"]
    phase = Phase(request.get("phase", "forward"))
    torch.set_num_threads(int(request["threads"]))
    module = m.load_module(ref)
    model_class = m.pick_model_class(module, ref.model_class)
    config = m.build_config(model_class, ref.config)
    model = m.build_model(model_class, config, implementation, device, settings.seed, request.get("dtype", "float32"))
    kind: Kind = ref.kind
    inputs = m.make_inputs(config, kind, settings, length, device)
    run = m.prefill_call(model, inputs) if phase is Phase.PREFILL else m.forward_call(model, inputs)
    with torch.inference_mode():
        run()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
        with torch.inference_mode():
            output = run()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del output
        return {"baseline_bytes": baseline, "peak_bytes": peak, "extra_bytes": peak - baseline, "method": "cuda"}
    exact = reset_peak_rss()
    baseline = _status_kib("VmRSS") * 1024
    with torch.inference_mode():
        output = run()
    peak = _status_kib("VmHWM") * 1024
    del output
    return {
        "baseline_bytes": baseline,
        "peak_bytes": peak,
        "extra_bytes": peak - baseline,
        "method": "rss" if exact else "rss-unreset",
    }


def main() -> None:
    request = json.loads(sys.stdin.read())
    json.dump(measure(request), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
