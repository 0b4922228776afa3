"""Profile one forward of a benchmark model: where the time and the memory of eager or SDPA attention go.

    python scripts/bench_profile.py gpt2 --length 1024 --implementation sdpa [--padding auto --batch 2]

Uses the same target resolution, in-memory port, config and inputs as `sdpa-port bench`, runs one warm-up and one
profiled forward (torch.profiler with memory), and prints the operators by self CPU time with their call counts and
the bytes they allocated, plus the shapes of the attention masks handed to SDPA.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(add_completion=False)


@app.command()
def profile(
    target: Annotated[str, typer.Argument(help="Modeling file or model name, as for `sdpa-port bench`.")],
    length: Annotated[int, typer.Option(help="Sequence length.")] = 1024,
    implementation: Annotated[str, typer.Option(help="eager or sdpa.")] = "sdpa",
    batch: Annotated[int, typer.Option(help="Examples per batch.")] = 1,
    padding: Annotated[str, typer.Option(help="none, auto, left or right.")] = "none",
    threads: Annotated[int, typer.Option(help="torch threads.")] = 1,
    rows: Annotated[int, typer.Option(help="Operators to list.")] = 18,
) -> None:
    import torch

    from sdpa_port.bench import measure
    from sdpa_port.bench.run import describe_model
    from sdpa_port.bench.spec import Settings
    from sdpa_port.bench.target import prepare

    torch.set_num_threads(threads)
    settings = Settings(lengths=(length,), threads=threads, batch=batch, padding=padding)
    prepared = prepare(target, Path(tempfile.mkdtemp(prefix="bench-profile-")))
    ref, chosen = describe_model(prepared, settings, None, None)
    config = measure.build_config(chosen, ref.config)
    model = measure.build_model(chosen, config, implementation, "cpu", settings.seed)
    inputs = measure.make_inputs(config, ref.kind, settings, length, "cpu")
    run = measure.forward_call(model, inputs)
    masks: list[str] = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        shape = "None" if mask is None else f"{tuple(mask.shape)} {mask.dtype} stride={mask.stride()}"
        masks.append(f"q={tuple(args[0].shape)} mask={shape} is_causal={kwargs.get('is_causal', False)}")
        return original(*args, **kwargs)

    with torch.inference_mode():
        run()
        torch.nn.functional.scaled_dot_product_attention = spy
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
                run()
        finally:
            torch.nn.functional.scaled_dot_product_attention = original
    typer.echo(f"{ref.model_class} {implementation} L={length} batch={batch} padding={padding}: {prepared.detail}")
    for line in masks:
        typer.echo(f"  sdpa call: {line}")
    typer.echo(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=40))


if __name__ == "__main__":
    sys.exit(app())
