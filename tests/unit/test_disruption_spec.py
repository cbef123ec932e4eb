"""spec.disruption: parsed with the CRD's defaults and bounds on all three kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuslice.spec.cluster import parse_cluster
from tpuslice.spec.parts import (
    DEFAULT_AVOID_MAINTENANCE_WITHIN_S,
    DEFAULT_GRACE_PERIOD_S,
    SpecError,
)

CRDS = Path(__file__).parents[2] / "crds"


def obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"tpu": {"type": "v6e", "topology": "4x4"}, "ray": {"version": "2.54.0"}}
    base.update(spec)
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "u"}, "spec": base}


def test_defaults() -> None:
    got = parse_cluster(obj()).disruption
    assert got.avoid_maintenance_within_s == DEFAULT_AVOID_MAINTENANCE_WITHIN_S == 604_800
    assert got.grace_period_s == DEFAULT_GRACE_PERIOD_S == 30


def test_values_kept() -> None:
    got = parse_cluster(
        obj(disruption={"avoidMaintenanceWithin": 0, "gracePeriodSeconds": 120})
    ).disruption
    assert (got.avoid_maintenance_within_s, got.grace_period_s) == (0, 120)


@pytest.mark.parametrize(
    ("disruption", "field"),
    [
        ({"avoidMaintenanceWithin": -1}, "spec.disruption.avoidMaintenanceWithin"),
        ({"avoidMaintenanceWithin": 2_592_001}, "spec.disruption.avoidMaintenanceWithin"),
        ({"avoidMaintenanceWithin": "1h"}, "spec.disruption.avoidMaintenanceWithin"),
        ({"gracePeriodSeconds": 3601}, "spec.disruption.gracePeriodSeconds"),
        ({"gracePeriodSeconds": True}, "spec.disruption.gracePeriodSeconds"),
        ({"drainAll": True}, "spec.disruption"),
    ],
)
def test_bad_values_name_the_field(disruption: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_cluster(obj(disruption=disruption))
    assert field in str(exc.value)


@pytest.mark.parametrize("kind", ["tpusliceclusters", "tpuslicejobs", "tpusliceservices"])
def test_crd_bounds_match_the_parser(kind: str) -> None:
    crd = yaml.safe_load((CRDS / f"tpuslice.dev_{kind}.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props = schema["properties"]["spec"]["properties"]["disruption"]["properties"]
    assert props["avoidMaintenanceWithin"]["default"] == DEFAULT_AVOID_MAINTENANCE_WITHIN_S
    assert props["avoidMaintenanceWithin"]["maximum"] == 2_592_000
    assert props["gracePeriodSeconds"]["default"] == DEFAULT_GRACE_PERIOD_S
    assert props["gracePeriodSeconds"]["maximum"] == 3600
