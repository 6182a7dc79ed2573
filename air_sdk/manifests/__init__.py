"""Manifests for other schedulers, rendered from a JobSpec: pure functions, no cluster.

>>> from air_sdk.manifests import render_trainjob
>>> render_trainjob(spec, image="ghcr.io/me/train:1")["kind"]  # doctest: +SKIP
'TrainJob'
"""

from air_sdk.manifests.k8s import TRAINJOB_API_VERSION, K8sOptions, render_trainjob, to_yaml

__all__ = ["TRAINJOB_API_VERSION", "K8sOptions", "render_trainjob", "to_yaml"]
