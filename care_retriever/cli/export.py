"""``export``: write the query tower to ONNX or OpenVINO (fp32, optionally int8) inside the model folder."""

from __future__ import annotations

from typing import Annotated

import typer

from care_retriever.cli.options import TrustRemoteCode
from care_retriever.errors import InputError


def export(
    model: Annotated[str, typer.Option(help="CARE model folder (the export is written inside it).")],
    backend: Annotated[str, typer.Option(help="onnx | openvino")] = "onnx",
    quantize: Annotated[str, typer.Option(help="int8 (also writes the fp32 model) | none (fp32 only).")] = "int8",
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Export the query tower for torch-free search (`search --backend onnx|openvino`)."""
    from care_retriever.search.backends.layout import EXPORT_BACKENDS, QUANTIZE

    if backend not in EXPORT_BACKENDS:
        raise InputError(f"Unknown --backend {backend!r}. Available export backends: {list(EXPORT_BACKENDS)}")
    if quantize not in QUANTIZE:
        raise InputError(f"Unknown --quantize {quantize!r}. Available: {list(QUANTIZE)}")
    from care_retriever.model.towers.loading import quiet_transformers

    quiet_transformers()
    files = ("none", "int8") if quantize == "int8" else ("none",)
    if backend == "openvino":
        from care_retriever.search.backends.openvino_export import export_openvino as run_export
    else:
        from care_retriever.search.backends.onnx_export import export_onnx as run_export
    typer.echo(f"Exporting the query tower of {model} to {backend} ...", err=True)
    report = run_export(model, files, trust_remote_code)
    for name, kind in report.files.items():
        cosine = report.min_cosine[name]
        typer.echo(f"{report.folder / name}: {'int8' if kind == 'int8' else 'fp32'}, min cosine to torch {cosine:.5f}")


def register(app: typer.Typer) -> None:
    app.command()(export)
