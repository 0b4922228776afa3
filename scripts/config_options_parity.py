"""Eager against SDPA under config options, for a model as installed or for a port file.

The hand ports are shorter than the tool's in part because they leave some config options to eager, or ignore them.
This measures it: for each option (a config keyword and a value) it builds the model twice with the same seed,
eager and SDPA, sharpens the weights (times 4, so a wrong scale or a dropped term shows), and prints the largest
|eager - SDPA| of the last hidden state on a padded batch of two.

    python scripts/config_options_parity.py gpt2 scale_attn_weights=False scale_attn_by_inverse_layer_idx=True
    python scripts/config_options_parity.py gpt2 --port /tmp/modeling_gpt2_port.py scale_attn_weights=False

Run it in the environment of the release in question (the hand ports of 4.47.1 in 4.47.1, a port of a 4.40.2 file in
4.40.2). A port file is loaded inside the model's package of the installed transformers.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False)


def load(model: str, port: Path | None) -> Any:
    if port is None:
        return importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    from sdpa_port.verify.loader import load_in_package

    return load_in_package(port, f"transformers.models.{model}")


def base_model_class(module: Any) -> type:
    from transformers import PreTrainedModel

    bases = [
        value
        for name, value in vars(module).items()
        if name.endswith("Model")
        and isinstance(value, type)
        and issubclass(value, PreTrainedModel)
        and getattr(value, "base_model_prefix", None)
        and value.__module__ == module.__name__
        and "PreTrained" not in name
    ]
    return min(bases, key=lambda cls: len(cls.__name__))


def max_difference(module: Any, options: dict[str, Any]) -> float:
    import torch

    model_class = base_model_class(module)
    outputs = {}
    for implementation in ("eager", "sdpa"):
        torch.manual_seed(0)
        config = model_class.config_class(
            vocab_size=100, hidden_size=64, n_embd=64, d_model=64, num_hidden_layers=2, n_layer=2, num_layers=2,
            encoder_layers=2, decoder_layers=2, num_attention_heads=4, n_head=4, encoder_attention_heads=4,
            decoder_attention_heads=4, intermediate_size=128, encoder_ffn_dim=128, decoder_ffn_dim=128, ffn_dim=128,
            **options,
        )
        config._attn_implementation = implementation
        model = model_class(config).eval()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(4)
            generator = torch.Generator().manual_seed(1)
            ids = torch.randint(3, 100, (2, 16), generator=generator)
            mask = torch.ones(2, 16, dtype=torch.long)
            mask[-1, :4] = 0
            kwargs = {"decoder_input_ids": ids} if getattr(config, "is_encoder_decoder", False) else {}
            outputs[implementation] = model(input_ids=ids, attention_mask=mask, **kwargs).last_hidden_state
    return (outputs["eager"] - outputs["sdpa"])[:, 4:].abs().max().item()


@app.command()
def main(
    model: Annotated[str, typer.Argument(help="Model folder in transformers, e.g. gpt2.")],
    options: Annotated[list[str], typer.Argument(help="NAME=VALUE config options (Python literals).")],
    port: Annotated[Path | None, typer.Option(help="A port of the model's file to load instead.")] = None,
) -> None:
    module = load(model, port)
    print(f"{model}: defaults: max|eager - sdpa| = {max_difference(module, {}):.2e}")
    for option in options:
        name, _, value = option.partition("=")
        parsed = {name: ast.literal_eval(value)}
        print(f"{model}: {option}: max|eager - sdpa| = {max_difference(module, parsed):.2e}")


if __name__ == "__main__":
    app()
