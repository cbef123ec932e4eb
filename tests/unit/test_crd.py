"""The CRDs judged offline: schema (unknown fields rejected) and every CEL rule.

The CEL rules repeat tpuslice.model.topology's rules in another language, so a grid
test proves they agree: for every generation and many shapes, the API server
accepts exactly what the operator can render.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.builders import tpu, tpuslice
from tests.support.crd import failing_rules, load_crd, rules_at, validate
from tpuslice.model.topology import (
    GENERATIONS,
    TopologyError,
    generation_names,
    resolve_generation,
    slice_shape,
)

TSC = "tpuslice.dev_tpusliceclusters.yaml"
TSJ = "tpuslice.dev_tpuslicejobs.yaml"
TSS = "tpuslice.dev_tpusliceservices.yaml"
RES = "tpuslice.dev_slicereservations.yaml"
POL = "tpuslice.dev_tpuslicepolicies.yaml"
CRD_OF_KIND = {
    "TPUSliceCluster": TSC,
    "TPUSliceJob": TSJ,
    "TPUSliceService": TSS,
    "TPUSlicePolicy": POL,
}
EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def cluster(**fields: Any) -> dict[str, Any]:
    """A TPUSliceCluster as a user writes it (no uid); ``fields`` adds to ``spec.tpu``."""
    return tpuslice(tpu=tpu(**fields))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(example: Path) -> None:
    for doc in yaml.safe_load_all(example.read_text()):
        assert validate(CRD_OF_KIND[doc["kind"]], doc) == []


def test_examples_cover_every_kind() -> None:
    kinds = {doc["kind"] for e in EXAMPLES for doc in yaml.safe_load_all(e.read_text())}
    assert kinds == set(CRD_OF_KIND)


#: GKE's sub-slicing annotation on a worker template (refused: not supported yet).
SUB_SLICE = "cloud.google.com/gke-tpu-slice-topology"


def with_spec(patch: dict[str, Any], name: str = "llm") -> dict[str, Any]:
    obj = cluster()
    obj["metadata"]["name"] = name
    for key, value in patch.items():
        obj["spec"][key] = (
            {**obj["spec"].get(key, {}), **value} if isinstance(value, dict) else value
        )
    return obj


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (with_spec({"tpu": {"type": "v9"}}), "is not one of"),
        (with_spec({"tpu": {"topology": "4x4x4"}}), "v5e and v6e slices are 2-dimensional"),
        (
            with_spec({"tpu": {"topology": "3x3"}}),
            "v5e and v6e slices are 2-dimensional and one of",
        ),
        (with_spec({"tpu": {"topology": "0x4"}}), "must be positive integers joined by 'x'"),
        (with_spec({"tpu": {"topology": "4 x 4"}}), "must be positive integers joined by 'x'"),
        (with_spec({"tpu": {"type": "v4", "topology": "2x2"}}), "v4 slices are 3-dimensional"),
        (with_spec({"tpu": {"type": "v5p", "topology": "4x4x28"}}), "v5p slices are 3-dimensional"),
        (
            with_spec({"tpu": {"type": "tpu7x", "topology": "4x4"}}),
            "tpu7x slices are 3-dimensional",
        ),
        (with_spec({"tpu": {"slices": 0}}), "less than the minimum of 1"),
        (with_spec({"tpu": {"chipsPerHost": 8}}), "spec.tpu.chipsPerHost does not fit"),
        (with_spec({"tpu": {"chipsPerHost": 3}}), "is not one of [1, 4, 8]"),
        (with_spec({"ray": {"version": "2.53.0"}}), "at least 2.54.0"),
        (with_spec({"ray": {"version": "latest"}}), "at least 2.54.0"),
        (
            with_spec({"worker": {"resources": {"google.com/tpu": 4}}}),
            "must not set google.com/tpu",
        ),
        (with_spec({"worker": {"resources": {"memory": "lots"}}}), "does not match"),
        (
            with_spec({"worker": {"template": {"metadata": {"annotations": {SUB_SLICE: "2x4"}}}}}),
            "sub-slicing is not supported yet",
        ),
        (with_spec({"worker": {"replicas": 3}}), "Additional properties are not allowed"),
        (
            with_spec({"reservation": {"policy": "Pool"}}),
            "is not one of ['NodePool', 'DynamicSlice', 'None']",
        ),
        (with_spec({}, name="a" * 54), "metadata.name must be at most 53 characters"),
        (with_spec({}, name="9lives"), "must be a DNS-1035 label"),
        (with_spec({}, name="my.cluster"), "must be a DNS-1035 label"),
    ],
)
def test_bad_objects_are_rejected_with_a_message_naming_the_field(
    obj: dict[str, Any], fragment: str
) -> None:
    messages = validate(TSC, obj)
    assert any(fragment in m for m in messages), messages


def test_name_at_the_limit_is_accepted() -> None:
    assert validate(TSC, with_spec({}, name="a" * 53)) == []


def test_missing_required_fields() -> None:
    obj = cluster()
    del obj["spec"]["ray"]
    assert any("'ray' is a required property" in m for m in validate(TSC, obj))


def test_slice_shape_is_immutable_but_slices_are_not() -> None:
    old = cluster(slices=1)
    assert validate(TSC, cluster(slices=3), old=old) == []
    changed = validate(TSC, cluster(topology="2x2"), old=old)
    assert any("spec.tpu.type, topology and chipsPerHost are immutable" in m for m in changed)
    changed = validate(TSC, cluster(topology="2x4", chipsPerHost=4), old=cluster(topology="2x4"))
    assert any("immutable" in m for m in changed)


def test_defaults_are_applied() -> None:
    from tests.support.crd import apply_defaults, served_schema

    defaulted = apply_defaults(served_schema(load_crd(TSC)), cluster())
    assert defaulted["spec"]["tpu"]["slices"] == 1
    assert defaulted["spec"]["reservation"] == {"policy": "NodePool", "priority": 0}
    assert defaulted["spec"]["suspend"] is False


def test_type_enum_is_every_spelling_the_operator_accepts() -> None:
    schema = load_crd(TSC)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    enum = schema["properties"]["spec"]["properties"]["tpu"]["properties"]["type"]["enum"]
    assert sorted(enum) == sorted(generation_names())


def _python_accepts(tpu_type: str, topology: str, cph: int | None) -> bool:
    try:
        slice_shape(tpu_type, topology, cph)
    except TopologyError:
        return False
    return True


def _grid(dims: int, values: tuple[int, ...]) -> list[str]:
    return ["x".join(str(v) for v in combo) for combo in itertools.product(values, repeat=dims)]


SHAPE_GRID = (
    _grid(2, (0, 1, 2, 3, 4, 8, 16, 32))
    + _grid(3, (1, 2, 3, 4, 8, 12, 16, 24, 28))
    + ["4x4x4x4", "x4", "4x", "04x4"]
)


@pytest.mark.parametrize("generation", [g.name for g in GENERATIONS])
def test_cel_and_python_agree_on_every_shape(generation: str) -> None:
    """CEL accepts exactly the (topology, chipsPerHost) pairs the operator can render."""
    rules = rules_at(TSC, "spec", "tpu")
    host_rules = [r for r in rules if "chipsPerHost" in r["rule"]]
    disagreements = []
    for topology in SHAPE_GRID:
        tpu: dict[str, Any] = {"type": generation, "topology": topology}
        shape_ok = failing_rules(rules, tpu) == []
        if shape_ok != _python_accepts(generation, topology, None):
            disagreements.append((topology, None, shape_ok))
        for cph in (1, 4, 8):
            cel_ok = shape_ok and failing_rules(host_rules, {**tpu, "chipsPerHost": cph}) == []
            if cel_ok != _python_accepts(generation, topology, cph):
                disagreements.append((topology, cph, cel_ok))
    assert disagreements == []


@pytest.mark.parametrize("spelling", generation_names())
def test_cel_treats_every_spelling_like_its_generation(spelling: str) -> None:
    rules = rules_at(TSC, "spec", "tpu")
    canonical = resolve_generation(spelling).name
    for topology in ("4x4", "2x4", "2x2x2", "2x2x1", "1x1x1", "16x16x24"):
        for cph in (None, 4, 8):
            extra = {} if cph is None else {"chipsPerHost": cph}
            assert failing_rules(rules, {"type": spelling, "topology": topology, **extra}) == (
                failing_rules(rules, {"type": canonical, "topology": topology, **extra})
            )


def test_every_generation_is_in_the_grid() -> None:
    assert {g.name for g in GENERATIONS} <= set(generation_names())


def reservation(**spec: Any) -> dict[str, Any]:
    base = {
        "nodePool": "pool-a",
        "gkeAccelerator": "tpu-v6e-slice",
        "acceleratorType": "v6e-16",
        "topology": "4x4",
        "hosts": 4,
        "holder": {
            "namespace": "ml",
            "name": "llm",
            "uid": "u-1",
            "replicaName": "tpu-abcde",
            "replicaIndex": 0,
        },
    }
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "SliceReservation",
        "metadata": {"name": "pool-a"},
        "spec": {**base, **spec},
        "status": {"phase": "Reserved"},
    }


def test_reservation_valid_and_named_after_its_pool() -> None:
    assert validate(RES, reservation()) == []
    assert any("must equal spec.node" in m for m in validate(RES, reservation(nodePool="b")))


def test_a_node_reservation_is_named_after_its_node() -> None:
    """A single-host slice holds one node of a pool: the reservation names the node."""
    node = reservation()
    node["metadata"]["name"] = "gke-tpu-n1"
    node["spec"]["node"] = "gke-tpu-n1"
    assert validate(RES, node) == []
    node["spec"]["node"] = "gke-tpu-n2"
    assert any("must equal spec.node for a node" in m for m in validate(RES, node))
    old = copy.deepcopy(node)
    old["spec"]["node"] = "gke-tpu-n1"
    moved = copy.deepcopy(old)
    moved["spec"]["node"] = "gke-tpu-n3"
    assert any("spec.node is immutable" in m for m in validate(RES, moved, old=old))


def test_reservation_spec_is_immutable_but_for_the_holders_slice() -> None:
    old = reservation()
    new = copy.deepcopy(old)
    new["spec"]["holder"]["name"] = "thief"
    assert any("may change only its replicaName" in m for m in validate(RES, new, old=old))
    kind = copy.deepcopy(old)
    kind["spec"]["holder"]["kind"] = "TPUSliceJob"
    assert any("may change only its replicaName" in m for m in validate(RES, kind, old=old))
    for field, value in (("topology", "8x8"), ("hosts", 99), ("nodePool", "other")):
        changed = copy.deepcopy(old)
        changed["spec"][field] = value
        assert any(f"spec.{field} is immutable" in m for m in validate(RES, changed, old=old))
    # a TPUSliceJob's retry gives the pool to its new RayCluster's slice
    handed = copy.deepcopy(old)
    handed["spec"]["holder"]["replicaName"] = "workers-new"
    handed["spec"]["holder"]["replicaIndex"] = 1
    assert validate(RES, handed, old=old) == []
    status_only = copy.deepcopy(old)
    status_only["status"]["phase"] = "Bound"
    assert validate(RES, status_only, old=old) == []


def test_status_example_from_the_design_is_valid() -> None:
    obj = cluster(slices=2)
    obj["status"] = {
        "observedGeneration": 3,
        "acceleratorType": "v6e-16",
        "hostsPerSlice": 4,
        "chipsPerHost": 4,
        "rayCluster": "llm",
        "desiredSlices": 2,
        "readySlices": 1,
        "sliceReadiness": "1/2",
        "slices": [
            {
                "index": 0,
                "replica": "tpu-ab12c",
                "nodePool": "pool-a",
                "state": "Ready",
                "readyHosts": 4,
            },
            {"index": 1, "replica": "tpu-x9y8z", "state": "WaitingForCapacity"},
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "observedGeneration": 3,
                "lastTransitionTime": "2026-11-30T00:00:00Z",
                "reason": "WaitingForCapacity",
                "message": "slice 1 needs a free node pool",
            },
        ],
    }
    assert validate(TSC, obj) == []


@pytest.mark.parametrize("crd_file", [TSC, TSJ, TSS, RES, POL])
def test_crds_are_small_and_described(crd_file: str) -> None:
    path = Path(__file__).parents[2] / "crds" / crd_file
    # `kubectl apply` (client-side, what README's install uses) stores the whole object in
    # the last-applied-configuration annotation, and annotations are capped at 256 KiB
    # (apimachinery's TotalAnnotationSizeLimitB); half of that keeps room to grow.
    assert path.stat().st_size < 128 * 1024

    def undocumented(schema: dict[str, Any], where: str) -> list[str]:
        missing = [] if "description" in schema or where.endswith("metadata") else [where]
        for name, sub in (schema.get("properties") or {}).items():
            missing += undocumented(sub, f"{where}.{name}")
        if "items" in schema:
            missing += undocumented(schema["items"], f"{where}[]")
        return missing

    schema = load_crd(crd_file)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert undocumented(schema, "") == []


@pytest.mark.parametrize("crd_file", [TSC, TSJ, TSS, RES, POL])
def test_printer_columns_are_well_formed(crd_file: str) -> None:
    columns = load_crd(crd_file)["spec"]["versions"][0]["additionalPrinterColumns"]
    for column in columns:
        assert set(column) <= {"name", "type", "jsonPath", "description", "priority", "format"}
        assert column["jsonPath"].startswith(".")


# ------------------------------------------- the TPUSlice kinds share one schema source


def _spec_properties(crd_file: str) -> dict[str, Any]:
    schema = load_crd(crd_file)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]["properties"]  # type: ignore[no-any-return]


def _status_properties(crd_file: str) -> dict[str, Any]:
    schema = load_crd(crd_file)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["status"]["properties"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("crd_file", [TSJ, TSS])
def test_cluster_parts_are_the_same_in_every_kind(crd_file: str) -> None:
    """One source (crds/parts/): the cluster parts and slice status cannot drift."""
    for part in ("tpu", "ray", "head", "worker", "reservation"):
        assert _spec_properties(crd_file)[part] == _spec_properties(TSC)[part], part
    for field in ("acceleratorType", "hostsPerSlice", "chipsPerHost"):
        assert _status_properties(crd_file)[field] == _status_properties(TSC)[field]
    assert (
        _status_properties(crd_file)["conditions"]["items"]
        == (_status_properties(TSC)["conditions"]["items"])
    )
    slices = _status_properties(TSC)["slices"]
    if crd_file == TSJ:
        assert _status_properties(TSJ)["slices"] == slices
    else:
        for cluster in ("activeCluster", "pendingCluster"):
            assert _status_properties(TSS)[cluster]["properties"]["slices"] == slices


@pytest.mark.parametrize("crd_file", [TSJ, TSS])
def test_new_kinds_are_in_the_tpuslice_category_with_short_names(crd_file: str) -> None:
    names = load_crd(crd_file)["spec"]["names"]
    assert names["categories"] == ["tpuslice"]
    assert names["shortNames"] in (["tsj"], ["tss"])
    assert load_crd(crd_file)["spec"]["scope"] == "Namespaced"


def tpuslice_job(**job: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceJob",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "tpu": {"type": "v6e", "topology": "4x4", "slices": 2},
            "ray": {"version": "2.54.0"},
            "job": {"entrypoint": "python train.py", **job},
        },
    }


def tpuslice_service(**serve: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceService",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": {
            "tpu": {"type": "v6e", "topology": "4x4"},
            "ray": {"version": "2.54.0"},
            "serve": {"serveConfigV2": "applications: []", **serve},
        },
    }


def test_job_defaults_are_applied() -> None:
    from tests.support.crd import apply_defaults, served_schema

    defaulted = apply_defaults(served_schema(load_crd(TSJ)), tpuslice_job())
    job = defaulted["spec"]["job"]
    assert (job["submissionMode"], job["shutdownAfterJobFinishes"], job["suspend"]) == (
        "K8sJobMode",
        True,
        False,
    )


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (tpuslice_job(entrypoint=None), "spec.job.entrypoint is required"),
        (tpuslice_job(entrypoint=""), "should be non-empty"),
        (
            tpuslice_job(suspend=True, shutdownAfterJobFinishes=False),
            "spec.job.suspend needs spec.job.shutdownAfterJobFinishes true",
        ),
        (
            tpuslice_job(ttlSecondsAfterFinished=60, shutdownAfterJobFinishes=False),
            "spec.job.ttlSecondsAfterFinished needs spec.job.shutdownAfterJobFinishes true",
        ),
        (
            tpuslice_job(submissionMode="InteractiveMode", backoffLimit=2),
            "spec.job.backoffLimit must be 0 with submissionMode InteractiveMode",
        ),
        (
            tpuslice_job(submissionMode="SidecarMode", submitterConfig={"backoffLimit": 1}),
            "do not apply to submissionMode SidecarMode",
        ),
        (tpuslice_job(clusterSelector={"ray.io/cluster": "x"}), "spec.job.clusterSelector is not"),
        (tpuslice_job(deletionStrategy={"onSuccess": {}}), "spec.job.deletionStrategy is not"),
        (tpuslice_job(managedBy="kueue.x-k8s.io/multikueue"), "spec.job.managedBy is not"),
        (tpuslice_job(rayClusterSpec={}), "spec.job.rayClusterSpec is rendered by the operator"),
        (tpuslice_job(activeDeadlineSeconds=0), "less than the minimum of 1"),
        (tpuslice_job(submissionMode="Batch"), "is not one of"),
        (tpuslice_job(preRunningDeadlineSeconds=5), "Additional properties are not allowed"),
        (
            tpuslice_service(upgradeStrategy={"type": "NewClusterWithIncrementalUpgrade"}),
            "NewClusterWithIncrementalUpgrade needs the Ray autoscaler",
        ),
        (
            tpuslice_service(upgradeStrategy={"clusterUpgradeOptions": {"maxSurgePercent": 50}}),
            "clusterUpgradeOptions only applies to",
        ),
        (tpuslice_service(rayClusterConfig={}), "spec.serve.rayClusterConfig is rendered"),
        (tpuslice_service(serviceUnhealthySecondThreshold=900), "deprecated and ignored"),
        (tpuslice_service(serveConfigV2=None), "'serveConfigV2' is a required property"),
        (tpuslice_service(rayClusterDeletionDelaySeconds=-1), "less than the minimum of 0"),
    ],
)
def test_bad_jobs_and_services_are_rejected_naming_field_and_fix(
    obj: dict[str, Any], fragment: str
) -> None:
    for section in ("job", "serve"):
        if section in obj["spec"]:
            obj["spec"][section] = {k: v for k, v in obj["spec"][section].items() if v is not None}
    messages = validate(CRD_OF_KIND[obj["kind"]], obj)
    assert any(fragment in m for m in messages), messages


@pytest.mark.parametrize("kind", ["TPUSliceJob", "TPUSliceService"])
def test_job_and_service_names_leave_room_for_kuberays_suffix(kind: str) -> None:
    obj = tpuslice_job() if kind == "TPUSliceJob" else tpuslice_service()
    obj["metadata"]["name"] = "a" * 47
    assert validate(CRD_OF_KIND[kind], obj) == []
    obj["metadata"]["name"] = "a" * 48
    assert any("at most 47 characters" in m for m in validate(CRD_OF_KIND[kind], obj))


def test_job_tpu_is_immutable_service_tpu_is_not() -> None:
    old = tpuslice_job()
    new = copy.deepcopy(old)
    new["spec"]["tpu"]["slices"] = 3
    assert any("spec.tpu is immutable" in m for m in validate(TSJ, new, old=old))
    new = copy.deepcopy(old)
    new["spec"]["job"]["suspend"] = True
    assert validate(TSJ, new, old=old) == []
    old_service = tpuslice_service()
    new_service = copy.deepcopy(old_service)
    new_service["spec"]["tpu"]["topology"] = "2x4"  # an upgrade to a new cluster
    assert validate(TSS, new_service, old=old_service) == []


def test_cluster_part_rules_apply_to_every_kind() -> None:
    for obj in (tpuslice_job(), tpuslice_service()):
        obj["spec"]["tpu"]["topology"] = "3x3"
        assert any(
            "v5e and v6e slices are 2-dimensional" in m
            for m in validate(CRD_OF_KIND[obj["kind"]], obj)
        )


def test_worker_template_metadata_stays_free_but_for_the_sub_slicing_annotation() -> None:
    """Declaring the template's annotations (so the rule can read them) refuses nothing
    else: other annotations, labels and fields are kept as written, in every kind."""
    template = {
        "metadata": {"annotations": {"team": "a"}, "labels": {"x": "y"}, "anything": 1},
        "spec": {"priorityClassName": "high"},
    }
    assert validate(TSC, with_spec({"worker": {"template": template}})) == []
    for obj in (tpuslice_job(), tpuslice_service()):
        obj["spec"]["worker"] = {"template": {"metadata": {"annotations": {SUB_SLICE: "2x2"}}}}
        assert any(
            "sub-slicing is not supported yet" in m for m in validate(CRD_OF_KIND[obj["kind"]], obj)
        )
