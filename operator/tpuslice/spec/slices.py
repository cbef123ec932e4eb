"""The slice parts of an object of any of the three kinds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from tpuslice.model import constants
from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.job import parse_job
from tpuslice.spec.parts import SliceClusterSpec
from tpuslice.spec.service import parse_service

__all__ = ["SLICE_PARTS", "parse_slice_parts"]


def _job_parts(obj: Mapping[str, Any]) -> SliceClusterSpec:
    job = parse_job(obj)  # a suspended job wants no slices, as a suspended cluster
    return replace(job.cluster, suspend=job.job.suspend)


def _service_parts(obj: Mapping[str, Any]) -> SliceClusterSpec:
    return parse_service(obj).cluster


#: Each kind's parser of its slice parts, by ``kind``.
SLICE_PARTS: dict[str, Callable[[Mapping[str, Any]], SliceClusterSpec]] = {
    constants.KIND_CLUSTER: parse_cluster,
    constants.KIND_JOB: _job_parts,
    constants.KIND_SERVICE: _service_parts,
}


def parse_slice_parts(obj: Mapping[str, Any]) -> SliceClusterSpec:
    """The cluster parts of a TPUSliceCluster, TPUSliceJob or TPUSliceService (by its
    ``kind``; none means a TPUSliceCluster): what the shape's queue and the planner read."""
    return SLICE_PARTS.get(obj.get("kind") or constants.KIND_CLUSTER, parse_cluster)(obj)
