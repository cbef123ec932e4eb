"""The slice parts of an object of any of the three kinds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tpuslice.model import constants
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.parts import SliceClusterSpec
from tpuslice.spec.service import parse_service

__all__ = ["parse_slice_parts"]


def parse_slice_parts(obj: Mapping[str, Any]) -> SliceClusterSpec:
    """The cluster parts of a TPUSliceCluster, TPUSliceJob or TPUSliceService (by its
    ``kind``; none means a TPUSliceCluster): what the shape's queue and the planner read."""
    kind = obj.get("kind") or constants.KIND_CLUSTER
    if kind == constants.KIND_JOB:
        job = parse_job(obj)  # a suspended job wants no slices, as a suspended cluster
        return replace(job.cluster, suspend=job.job.suspend)
    if kind == constants.KIND_SERVICE:
        return parse_service(obj).cluster
    return parse_cluster(obj)
