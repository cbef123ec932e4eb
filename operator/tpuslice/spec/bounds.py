"""Every bound on a TPUSlice object's input, in one place: the string lengths, map sizes
and serialized template sizes the parse step enforces (the CRDs carry the same
numbers as ``maxLength``/``maxProperties``; ``tests/unit/test_bounds.py`` keeps the two
equal), and the slices and hosts one object may ask for (``SpecLimits``, an operator
setting).

Why bounds at all: a TPUSlice object is parsed, rendered and compared on every pass,
and what it renders is copied into a KubeRay object and, per host, into pods. Without
bounds one object could make every pass slow (a megabyte of YAML parsed again and
again) or make the operator create millions of gated pods. Each number is chosen so
that no real spec comes near it and so that the largest object allowed still fits the
API server's request limit with room to spare: etcd refuses requests over 1.5 MiB
(etcd ``--max-request-bytes`` default 1572864, "etcd: System limits",
https://etcd.io/docs/v3.5/dev-guide/limit/), and the rendered RayJob or RayService
carries the user's strings and templates a second time. The worst TPUSliceJob these
bounds allow is about 700 KiB (runtimeEnvYAML 256 KiB + entrypoint 64 KiB + three
templates of 128 KiB + small fields); the worst TPUSliceService about 550 KiB.
README.md "Limits" has the table a user reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tpuslice.model import constants

__all__ = [
    "CEILING",
    "MAX_ENTRYPOINT",
    "MAX_HOSTS_CEILING",
    "MAX_MAP_VALUE",
    "MAX_QUANTITY",
    "MAX_RESOURCES",
    "MAX_SHORT_STRING",
    "MAX_START_PARAMS",
    "MAX_YAML_STRING",
    "STRING_BOUNDS",
    "TEMPLATE_BYTES",
    "SpecLimits",
    "json_size",
]

KiB: Final = 1024

#: spec.job.runtimeEnvYAML and spec.serve.serveConfigV2: Ray runtime environments and
#: Serve configs are a few KiB (pip lists, env vars, a working_dir URI, the
#: applications); 256 KiB is 50x a large one and still a sixth of the request limit.
MAX_YAML_STRING: Final = 256 * KiB
#: spec.job.entrypoint: one shell command. Linux refuses a single argument longer than
#: MAX_ARG_STRLEN (32 pages, 128 KiB; execve(2) "Limits on size of arguments and
#: environment"), and KubeRay's submitter passes the entrypoint on its command line
#: with the runtime environment, so half of that.
MAX_ENTRYPOINT: Final = 64 * KiB
#: Values of the string maps (rayStartParams, spec.job.metadata) and the small string
#: fields passed through to KubeRay (entrypointResources, a JSON object of custom
#: resources): longer values are mistakes, not settings.
MAX_MAP_VALUE: Final = 4 * KiB
#: Identifiers (spec.job.jobId, spec.job.managedBy): Ray job submission IDs are short
#: generated names; a Kubernetes name is at most 253 characters.
MAX_SHORT_STRING: Final = 253
#: Keys of spec.head.resources / spec.worker.resources: a pod has a handful of
#: resource names (cpu, memory, ephemeral-storage and a few extended resources).
MAX_RESOURCES: Final = 32
#: Keys of rayStartParams and spec.job.metadata: `ray start` has about 40 options.
MAX_START_PARAMS: Final = 64
#: The longest quantity string: digits, a fraction and a suffix (e.g. "1.5Gi").
MAX_QUANTITY: Final = 64

#: The string fields the parse step bounds, by path, and their bound in characters.
STRING_BOUNDS: Final[Mapping[str, int]] = {
    "spec.job.entrypoint": MAX_ENTRYPOINT,
    "spec.job.runtimeEnvYAML": MAX_YAML_STRING,
    "spec.job.jobId": MAX_SHORT_STRING,
    "spec.job.entrypointResources": MAX_MAP_VALUE,
    "spec.serve.serveConfigV2": MAX_YAML_STRING,
}

#: The free-form objects (``x-kubernetes-preserve-unknown-fields`` in the CRDs, where
#: the schema can bound nothing) and the most bytes their compact JSON may take. A
#: whole pod template with a dozen containers, their env and volumes is 10-30 KiB;
#: 128 KiB is four times the largest seen. A Service spec is a few hundred bytes.
#: Refused fields (rayClusterSpec, rayClusterConfig, deletionStrategy) are not here:
#: the CRD refuses them whatever their size.
TEMPLATE_BYTES: Final[Mapping[str, int]] = {
    "spec.head.template": 128 * KiB,
    "spec.worker.template": 128 * KiB,
    # each of up to 16 groups: together at most the request limit (1.5 MiB) of one object
    "spec.workerGroups[].template": 64 * KiB,
    "spec.job.submitterPodTemplate": 128 * KiB,
    "spec.serve.serveService": 32 * KiB,
    # KubeRay's ClusterUpgradeOptions is four small fields (the surge and step
    # percentages, the interval, the Gateway class name)
    "spec.serve.upgradeStrategy.clusterUpgradeOptions": 4 * KiB,
}

#: The most hosts (worker pods) any setting may allow one object: GKE 1.31 and later
#: supports clusters of up to 65,000 nodes ("Plan for large GKE clusters",
#: https://cloud.google.com/kubernetes-engine/docs/concepts/planning-large-clusters)
#: and every TPU host is a node, so more hosts than that can never run.
MAX_HOSTS_CEILING: Final = 65_000


@dataclass(frozen=True)
class SpecLimits:
    """How many slices, and how many hosts (slices x hosts per slice, one worker pod
    each), one TPUSlice object may ask for. An operator setting (``tpuslice run
    --max-slices-per-object/--max-hosts-per-object``, chart ``limits``): a spec over it
    ends the pass InvalidSpec and nothing is rendered, so a typo such as
    ``slices: 4000`` cannot make the operator create and gate thousands of pods.

    Defaults: 64 slices is more than any multislice job we know of runs on one Ray
    cluster; 4096 hosts is 64 of the largest v5e/v6e slices (16x16, 64 hosts) or two
    of the largest v5p slices (16x16x24, 1536 hosts), so every single slice shape fits
    (tpu-facts: largest slices)."""

    max_slices: int = 64
    max_hosts: int = 4096

    def __post_init__(self) -> None:
        if not 1 <= self.max_slices <= constants.MAX_SLICES:
            raise ValueError(
                f"max slices per object must be from 1 to {constants.MAX_SLICES} (the CRD's "
                f"maximum of spec.tpu.slices), got {self.max_slices}"
            )
        if not 1 <= self.max_hosts <= MAX_HOSTS_CEILING:
            raise ValueError(
                f"max hosts per object must be from 1 to {MAX_HOSTS_CEILING} (GKE's largest "
                f"cluster in nodes), got {self.max_hosts}"
            )


#: The limits nothing can raise: what render enforces whatever the operator's setting.
CEILING: Final = SpecLimits(max_slices=constants.MAX_SLICES, max_hosts=MAX_HOSTS_CEILING)


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (UTF-8), the way it is sent to the API server.

    The C encoder makes this a few milliseconds even at the request limit, cheap next
    to the rendering it guards."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return len(text.encode("utf-8"))
