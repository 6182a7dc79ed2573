"""`air render`: a job file as a manifest another scheduler runs (no gateway involved).

air render k8s job.yaml --image ghcr.io/me/train:1 > trainjob.yaml
kubectl apply -f trainjob.yaml
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from air_sdk.cli._common import handle_errors
from air_sdk.errors import SpecError

if TYPE_CHECKING:
    from air_sdk.schema import JobSpec

__all__ = ["render_app"]

render_app = typer.Typer(
    help="Render a job file (a JobSpec in YAML or JSON) as another scheduler's manifest.",
    no_args_is_help=True,
)


def load_job_file(path: Path) -> JobSpec:
    """The JobSpec in a YAML or JSON file; errors name the file and the field."""
    from pydantic import ValidationError

    from air_sdk.client.client import format_validation_error
    from air_sdk.schema import JobSpec

    text = path.read_text()
    try:
        import yaml

        data = yaml.safe_load(text)
    except ImportError:
        import json

        data = json.loads(text)
    except Exception as exc:
        raise SpecError(f"{path}: not YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of JobSpec fields (name, entrypoint, ...)")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{path}: {format_validation_error(exc)}") from exc


@render_app.command("k8s")
@handle_errors
def k8s(
    job_file: Annotated[
        Path,
        typer.Argument(
            metavar="JOB.yaml", exists=True, dir_okay=False, help="A JobSpec in YAML or JSON."
        ),
    ],
    image: Annotated[
        str, typer.Option(help="Container image with the code, torch and air-runtime.")
    ],
    namespace: Annotated[str, typer.Option(help="Kubernetes namespace.")] = "default",
    name: Annotated[
        str | None, typer.Option(help="metadata.name (default: the job's name).")
    ] = None,
    runtime: Annotated[
        str, typer.Option(help="The ClusterTrainingRuntime to run on.")
    ] = "torch-distributed",
    gateway_url: Annotated[
        str | None,
        typer.Option(metavar="URL", help="AIR gateway the ranks report to (https, reachable)."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
) -> None:
    """A Kubeflow Trainer v2 TrainJob for JOB.yaml (kubectl apply -f it).

    Example: air render k8s job.yaml --image ghcr.io/me/train:1 -o trainjob.yaml
    """
    from air_sdk.manifests import K8sOptions, render_trainjob, to_yaml

    spec = load_job_file(job_file)
    try:
        options = K8sOptions(
            image=image, namespace=namespace, name=name, runtime=runtime, gateway_url=gateway_url
        )
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
    text = to_yaml(render_trainjob(spec, options))
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text)
