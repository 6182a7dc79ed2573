"""Manifests for other schedulers, rendered from a JobSpec: pure functions, no cluster.

>>> from air_sdk.manifests import K8sOptions, render_trainjob
>>> from air_sdk.schema import JobSpec
>>> render_trainjob(JobSpec(entrypoint="train.py"), K8sOptions(image="ghcr.io/me/train:1"))["kind"]
'TrainJob'
"""

from air_sdk.manifests.k8s import TRAINJOB_API_VERSION, K8sOptions, render_trainjob, to_yaml

__all__ = ["TRAINJOB_API_VERSION", "K8sOptions", "render_trainjob", "to_yaml"]
