"""The simulated GKE slice controller: its rules (tpusim.slices), its CRD, and its thin
shell (tpusim.slicectl) against an in-memory API, without a cluster.

The partitions are the two preset sub-blocks of one topology block
(``DYNAMIC_BLOCK_PRESETS``), so a 4x4x8 Slice over both is the case every rule is
checked against.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from tests.support.crd import to_jsonschema
from tpusim.nodepools import (
    DYNAMIC_BLOCK_PRESETS,
    PARTITION_ID_LABEL,
    PARTITION_STATE_LABEL,
    PRESETS,
    SLICE_LABEL,
    TOPOLOGY_BLOCK_LABEL,
    TOPOLOGY_LABEL,
    pool_nodes,
)
from tpusim.slicectl import CONFIG_MAP, SliceController, load_crd, set_partition_state
from tpusim.slices import (
    ACTIVATING,
    ACTIVE,
    ACTIVE_DEGRADED,
    FAILED,
    FAULT_ANNOTATION,
    FINALIZER,
    REASONS,
    RETRY_ANNOTATION,
    SLICE_CREATION_FAILED,
    Condition,
    Decision,
    Partition,
    SliceView,
    Timings,
    choose_fault,
    decide,
    holders,
    parse_rules,
    parse_slice,
    partitions_for,
    partitions_of,
    spec_errors,
    topology_errors,
)

A, B = (PRESETS[name].partition_id or "" for name in DYNAMIC_BLOCK_PRESETS)
T0 = 1_000_000.0
TIMINGS = Timings(activation_s=5.0)


def block_nodes() -> list[dict[str, Any]]:
    return [n for name in DYNAMIC_BLOCK_PRESETS for n in pool_nodes(PRESETS[name])]


def with_labels(
    nodes: list[dict[str, Any]], pid: str, **labels: str | None
) -> list[dict[str, Any]]:
    """``nodes`` with ``labels`` set (None: removed) on every node of partition ``pid``."""
    out = copy.deepcopy(nodes)
    for node in out:
        ls = node["metadata"]["labels"]
        if ls.get(PARTITION_ID_LABEL) == pid:
            for key, value in labels.items():
                key = {"state": PARTITION_STATE_LABEL, "block": TOPOLOGY_BLOCK_LABEL}.get(key, key)
                if value is None:
                    ls.pop(key, None)
                else:
                    ls[key] = value
    return out


def slice_view(
    name: str = "s1",
    topology: str = "4x4x8",
    pids: Iterable[str] = (A, B),
    reason: str | None = None,
    since: float = T0,
    **kw: Any,
) -> SliceView:
    ready = None
    if reason is not None:
        status = "True" if reason in (ACTIVE, ACTIVE_DEGRADED) else "False"
        ready = Condition(status, reason, "", since)
    return SliceView(
        name=name,
        created=kw.pop("created", T0),
        type=kw.pop("type", "tpu7x"),
        topology=topology,
        partition_ids=tuple(pids),
        finalizers=kw.pop("finalizers", (FINALIZER,)),
        ready=ready,
        **kw,
    )


def run(
    s: SliceView,
    nodes: list[dict[str, Any]] | None = None,
    held_by: Mapping[str, str] | None = None,
    labelled: Iterable[str] = (),
    now: float = T0,
) -> Decision:
    parts = partitions_of(block_nodes() if nodes is None else nodes)
    return decide(s, parts, held_by or {}, tuple(labelled), now, TIMINGS)


def all_nodes() -> list[str]:
    return sorted(n["metadata"]["name"] for n in block_nodes())


# ------------------------------------------------------------------ the presets


def test_block_presets_are_two_whole_healthy_partitions_of_one_block() -> None:
    parts = partitions_of(block_nodes())
    assert set(parts) == {A, B} and A != B
    for p in parts.values():
        assert p.whole and p.state == "HEALTHY" and p.blocks == {"tpusim-block1"}
        assert p.accelerators == {"tpu7x"} and not p.slices
    assert not any(TOPOLOGY_LABEL in n["metadata"]["labels"] for n in block_nodes())


# ------------------------------------------------------------------ the CRD


def _schema() -> dict[str, Any]:
    (version,) = load_crd()["spec"]["versions"]
    assert version["name"] == "v1beta1" and version["served"] and version["storage"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_crd_is_gke_slice_api() -> None:
    crd = load_crd()
    assert crd["metadata"]["name"] == "slices.accelerator.gke.io"
    assert crd["spec"]["group"] == "accelerator.gke.io"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == "Slice"
    (version,) = crd["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["State"] == '.status.conditions[?(@.type=="Ready")].reason'


def test_crd_accepts_the_doc_example_and_refuses_what_the_schema_can_say() -> None:
    validator = jsonschema.Draft7Validator(to_jsonschema(_schema()))
    good = {
        "apiVersion": "accelerator.gke.io/v1beta1",
        "kind": "Slice",
        "metadata": {"name": "test-slice"},
        "spec": {"type": "tpu7x", "topology": "4x4x8", "partitionIds": ["p1", "p2"]},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "FAILED",
                    "message": "",
                    "lastTransitionTime": "2026-01-11T23:45:38Z",
                }
            ]
        },
    }
    assert not list(validator.iter_errors(good))
    for path, value in (
        (("spec", "type"), "v6e"),
        (("spec", "topology"), "4x4"),
        (("spec", "partitionIds"), []),
        (("spec", "partitionIds"), [f"p{i}" for i in range(145)]),
        (("spec", "extra"), 1),
    ):
        bad = copy.deepcopy(good)
        bad[path[0]][path[1]] = value
        assert list(validator.iter_errors(bad)), (path, value)
    missing = copy.deepcopy(good)
    del missing["spec"]["partitionIds"]
    assert list(validator.iter_errors(missing))


def test_crd_spec_fields_are_immutable() -> None:
    spec = _schema()["properties"]["spec"]
    env = celpy.Environment()
    for name, old, new in (
        ("type", "tpu7x", "tpu7y"),
        ("topology", "4x4x8", "4x8x8"),
        ("partitionIds", ["a", "b"], ["a", "c"]),
    ):
        (rule,) = spec["properties"][name]["x-kubernetes-validations"]
        program = env.program(env.compile(rule["rule"]))
        same = {"self": celpy.json_to_cel(old), "oldSelf": celpy.json_to_cel(old)}
        changed = {"self": celpy.json_to_cel(new), "oldSelf": celpy.json_to_cel(old)}
        assert bool(program.evaluate(same)) and not bool(program.evaluate(changed))


# ------------------------------------------------------------------ the webhook's rules


@pytest.mark.parametrize(
    ("topology", "partitions"),
    [("4x4x4", 1), ("4x4x8", 2), ("4x8x8", 4), ("8x8x8", 8), ("4x4x16", 4), ("16x24x24", 144)],
)
def test_allowed_topologies_and_their_partition_counts(topology: str, partitions: int) -> None:
    assert topology_errors(topology) == []
    assert partitions_for(topology) == partitions


@pytest.mark.parametrize(
    ("topology", "says"),
    [
        ("4x8x4", "non-decreasing (4x4x8)"),
        ("4x4x6", "multiple of 4"),
        ("0x4x4", "multiple of 4"),
        ("16x24x28", "over 9216"),
        ("2x2x4", "sub-slice"),
        ("2x4x4", "sub-slice"),
        ("4x4", "AxBxC"),
        ("4x4x8x8", "AxBxC"),
        ("axbxc", "AxBxC"),
        ("4x4x\u00b2", "AxBxC"),
    ],
)
def test_refused_topologies_say_why(topology: str, says: str) -> None:
    errors = topology_errors(topology)
    assert errors and says in " ".join(errors)
    assert partitions_for(topology) is None


def test_spec_errors_name_the_field() -> None:
    assert spec_errors(slice_view()) == []
    cases = {
        "metadata.name": slice_view(name="x" * 50),
        "metadata.name ": slice_view(name="Upper"),
        "spec.type": slice_view(type="v6e"),
        "has 1 ids; topology 4x4x8 takes 2": slice_view(pids=(A,)),
        "must not repeat": slice_view(topology="4x4x8", pids=(A, A)),
    }
    for says, view in cases.items():
        assert says.strip() in " ".join(spec_errors(view)), says
    assert spec_errors(slice_view(name="x" * 49)) == []


# ------------------------------------------------------------------ forming a Slice


def test_a_valid_slice_gets_the_finalizer_and_activates_then_goes_active() -> None:
    new = slice_view(finalizers=())
    d = run(new)
    assert d.add_finalizer and d.holds and not d.label
    assert d.condition is not None and (d.condition.status, d.condition.reason) == (
        "False",
        ACTIVATING,
    )
    assert "(simulated by tpusim)" in d.condition.message
    activating = slice_view(reason=ACTIVATING, since=T0)
    early = run(activating, now=T0 + TIMINGS.activation_s - 0.1)
    assert early == Decision(holds=True)
    done = run(activating, now=T0 + TIMINGS.activation_s)
    assert done.condition is not None and (done.condition.status, done.condition.reason) == (
        "True",
        ACTIVE,
    )
    assert sorted(done.label) == all_nodes() and len(done.label) == 32


def test_an_active_slice_with_every_node_labelled_is_left_alone() -> None:
    active = slice_view(reason=ACTIVE)
    d = run(active, labelled=all_nodes())
    assert d.label == () and d.holds
    # the message differs from what the controller writes, so it is rewritten once; the
    # transition time is kept because the reason is unchanged
    assert d.condition is not None and d.condition.since == T0
    again = dataclasses.replace(active, ready=d.condition)
    assert run(again, labelled=all_nodes(), now=T0 + 50) == Decision(holds=True)


def test_a_node_missing_its_labels_is_labelled_again() -> None:
    d = run(slice_view(reason=ACTIVE), labelled=all_nodes()[1:])
    assert d.label == (all_nodes()[0],)


@pytest.mark.parametrize(
    ("nodes", "says"),
    [
        (
            lambda: [n for n in block_nodes() if n["metadata"]["labels"][PARTITION_ID_LABEL] == A],
            f"partition {B} does not exist",
        ),
        (lambda: with_labels(block_nodes(), B, state="UNHEALTHY"), f"partition {B} is UNHEALTHY"),
        (lambda: with_labels(block_nodes(), B, state="INCOMPLETE"), f"partition {B} is INCOMPLETE"),
        (lambda: with_labels(block_nodes(), B, state=None), f"partition {B} is UNSET"),
        (lambda: block_nodes()[1:], f"partition {A} has 15 of 16 nodes"),
        (lambda: with_labels(block_nodes(), B, block="other-block"), "span topology blocks"),
        (
            lambda: with_labels(block_nodes(), B, **{SLICE_LABEL: "foreign"}),
            f"partition {B} is in slice foreign",
        ),
        (
            lambda: with_labels(
                block_nodes(), B, **{"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}
            ),
            f"partition {B} is not tpu7x",
        ),
    ],
)
def test_a_slice_over_unusable_partitions_fails_creation_naming_the_partition(
    nodes: Any, says: str
) -> None:
    d = run(slice_view(finalizers=()), nodes=nodes())
    assert d.condition is not None and d.condition.reason == SLICE_CREATION_FAILED
    assert says in d.condition.message and not d.holds and d.add_finalizer


def test_a_partition_held_by_another_slice_is_refused() -> None:
    d = run(slice_view(name="s2"), held_by={B: "s1"})
    assert d.condition is not None and d.condition.reason == SLICE_CREATION_FAILED
    assert f"partition {B} is in Slice s1" in d.condition.message


def test_an_invalid_spec_fails_creation_before_looking_at_partitions() -> None:
    d = run(slice_view(topology="4x8x4"), nodes=[])
    assert d.condition is not None and d.condition.reason == SLICE_CREATION_FAILED
    assert "non-decreasing" in d.condition.message and "does not exist" not in d.condition.message


def test_a_degraded_partition_forms_an_active_degraded_slice() -> None:
    nodes = with_labels(block_nodes(), A, state="DEGRADED")
    assert run(slice_view(), nodes=nodes).condition.reason == ACTIVATING  # type: ignore[union-attr]
    d = run(slice_view(reason=ACTIVATING), nodes=nodes, now=T0 + 10)
    assert d.condition is not None and (d.condition.status, d.condition.reason) == (
        "True",
        ACTIVE_DEGRADED,
    )
    assert A in d.condition.message and len(d.label) == 32


# ------------------------------------------------------------------ health and faults


def test_partition_health_moves_an_active_slice() -> None:
    active = slice_view(reason=ACTIVE)
    failed = run(
        active, nodes=with_labels(block_nodes(), B, state="UNHEALTHY"), labelled=all_nodes()
    )
    assert failed.condition is not None and (failed.condition.status, failed.condition.reason) == (
        "False",
        FAILED,
    )
    assert f"partition {B} is UNHEALTHY" in failed.condition.message and failed.holds
    gone = run(active, nodes=block_nodes()[16:], labelled=all_nodes())
    assert gone.condition is not None and gone.condition.reason == FAILED
    degraded = run(
        active, nodes=with_labels(block_nodes(), B, state="DEGRADED"), labelled=all_nodes()
    )
    assert degraded.condition is not None and degraded.condition.reason == ACTIVE_DEGRADED
    healed = run(slice_view(reason=ACTIVE_DEGRADED), labelled=all_nodes())
    assert healed.condition is not None and healed.condition.reason == ACTIVE


def test_a_partition_failing_while_activating_fails_the_slice() -> None:
    d = run(slice_view(reason=ACTIVATING), nodes=with_labels(block_nodes(), A, state="UNHEALTHY"))
    assert d.condition is not None and d.condition.reason == FAILED and not d.label


@pytest.mark.parametrize("reason", [ACTIVATING, ACTIVE, ACTIVE_DEGRADED])
def test_fault_fail_fails_at_once(reason: str) -> None:
    s = slice_view(reason=reason, annotations={FAULT_ANNOTATION: "fail"})
    d = run(s, labelled=all_nodes())
    assert d.condition is not None and d.condition.reason == FAILED and d.holds
    assert "tpusim.dev/slice-fault" in d.condition.message


def test_fault_never_keeps_a_slice_activating_and_degrade_degrades() -> None:
    never = slice_view(reason=ACTIVATING, annotations={FAULT_ANNOTATION: "never"})
    assert run(never, now=T0 + 3600) == Decision(holds=True)
    degrade = slice_view(reason=ACTIVE, annotations={FAULT_ANNOTATION: "degrade"})
    d = run(degrade, labelled=all_nodes())
    assert d.condition is not None and (d.condition.status, d.condition.reason) == (
        "True",
        ACTIVE_DEGRADED,
    )
    unknown = slice_view(reason=ACTIVE, annotations={FAULT_ANNOTATION: "explode"})
    assert run(unknown, labelled=all_nodes()).condition.reason == ACTIVE  # type: ignore[union-attr]


def test_failed_is_final_without_retry_on_failure() -> None:
    failed = slice_view(reason=FAILED)
    assert run(failed) == Decision(holds=True)
    assert run(slice_view(reason=SLICE_CREATION_FAILED)) == Decision()


def test_retry_on_failure_activates_again_once_partitions_are_usable() -> None:
    retry = {RETRY_ANNOTATION: "true"}
    failed = slice_view(reason=FAILED, annotations=retry)
    still = run(failed, nodes=with_labels(block_nodes(), A, state="UNHEALTHY"))
    assert still == Decision(holds=True)
    again = run(failed)
    assert again.condition is not None and again.condition.reason == ACTIVATING
    assert again.condition.since == T0 and again.holds
    forced = slice_view(reason=FAILED, annotations={**retry, FAULT_ANNOTATION: "fail"})
    assert run(forced) == Decision(holds=True)
    refused = slice_view(reason=SLICE_CREATION_FAILED, annotations=retry)
    assert run(refused, held_by={A: "other"}).condition is not None
    assert run(refused).condition.reason == ACTIVATING  # type: ignore[union-attr]


# ------------------------------------------------------------------ deletion and holding


def test_deleting_unlabels_and_lets_the_finalizer_go() -> None:
    deleting = slice_view(reason=ACTIVE, deleting=True)
    d = run(deleting, labelled=all_nodes())
    assert d == Decision(remove_finalizer=True, unlabel=tuple(all_nodes()))
    foreign = slice_view(reason=ACTIVE, deleting=True, finalizers=("someone/else",))
    assert run(foreign) == Decision()


def test_holders_oldest_first_and_only_while_holding() -> None:
    views = [
        slice_view("young", reason=ACTIVATING, created=T0 + 1),
        slice_view("old", reason=FAILED, created=T0),
        slice_view("refused", pids=("x", "y"), reason=SLICE_CREATION_FAILED),
        slice_view("new", pids=("z", "w")),
    ]
    assert holders(views) == {A: "old", B: "old"}


def test_parse_slice_reads_what_the_controller_needs() -> None:
    obj = {
        "metadata": {
            "name": "s1",
            "creationTimestamp": "2026-01-11T23:45:38Z",
            "finalizers": [FINALIZER],
            "deletionTimestamp": "2026-01-11T23:50:00Z",
            "annotations": {RETRY_ANNOTATION: "true"},
        },
        "spec": {"type": "tpu7x", "topology": "4x4x8", "partitionIds": [A, B]},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "ACTIVE"}]},
    }
    view = parse_slice(obj)
    assert (view.name, view.topology, view.partition_ids) == ("s1", "4x4x8", (A, B))
    assert view.deleting and view.retries and view.reason == ACTIVE and view.fault == "none"
    assert set(REASONS) >= {ACTIVATING, ACTIVE, ACTIVE_DEGRADED, FAILED, SLICE_CREATION_FAILED}


def test_partition_state_is_the_worst_of_its_nodes() -> None:
    p = Partition(
        "p", ("n",), frozenset({"HEALTHY", "DEGRADED"}), frozenset(), frozenset(), frozenset()
    )
    assert p.state == "DEGRADED"
    assert dataclasses.replace(p, states=frozenset({"UNHEALTHY", "HEALTHY"})).state == "UNHEALTHY"


# ------------------------------------------------------------------ faults and settings


def test_fault_rules_match_by_glob_and_run_out() -> None:
    rules = parse_rules(
        [{"match": "demo-*", "fault": "fail", "times": 1}, {"match": "*", "fault": "degrade"}]
    )
    assert choose_fault("demo-0", rules, {}) == 0
    assert choose_fault("demo-1", rules, {0: 1}) == 1
    assert choose_fault("other", rules[:1], {}) is None
    assert parse_rules(yaml.safe_load(yaml.safe_dump([r.to_dict() for r in rules]))) == rules


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"match": "x"}, "fault"),
        ([{"match": "x", "fault": "explode"}], "explode"),
        ([{"match": "", "fault": "fail"}], "match"),
        ([{"match": "x", "fault": "fail", "times": 0}], "times"),
        ([{"match": "x", "fault": "fail", "times": "1"}], "times"),
        ([{"match": "x", "fault": "fail", "extra": 1}], "faults[0]"),
        ([{"match": "x", "fault": "fail"}] * 101, "at most 100"),
    ],
)
def test_bad_fault_rules_are_refused_naming_the_field(raw: Any, says: str) -> None:
    with pytest.raises(ValueError, match=r".*") as exc:
        parse_rules(raw)
    assert says in str(exc.value)


def test_timings_from_the_configmap() -> None:
    assert Timings.from_mapping({"activationS": 1}) == Timings(activation_s=1.0)
    assert Timings.from_mapping(None, TIMINGS) == TIMINGS
    for raw, says in (
        ({"activationS": -1}, "between 0 and 3600"),
        ({"activationS": "1"}, "number of seconds"),
        ({"activation": 1}, "unknown keys"),
        ([1], "mapping"),
    ):
        with pytest.raises(ValueError) as exc:
            Timings.from_mapping(raw)
        assert says in str(exc.value)


# ------------------------------------------------------------------ the shell


class _Obj:
    def __init__(self, name: str) -> None:
        self.metadata = type("Meta", (), {"name": name})()


class FakeApi:
    """Nodes, Slices and one ConfigMap in memory, with merge-patch semantics."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in copy.deepcopy(nodes)}
        self.slices: dict[str, dict[str, Any]] = {}
        self.config: dict[str, str] | None = None

    # CoreV1Api
    def list_node(self, label_selector: str | None = None) -> Any:
        items = list(self.nodes.values())
        if label_selector:
            key, _, value = label_selector.partition("=")
            items = [n for n in items if n["metadata"]["labels"].get(key) == value]
            return type("L", (), {"items": [_Obj(n["metadata"]["name"]) for n in items]})()
        return type("L", (), {"items": copy.deepcopy(items)})()

    def patch_node(self, name: str, body: Mapping[str, Any]) -> None:
        labels = self.nodes[name]["metadata"]["labels"]
        for key, value in body["metadata"]["labels"].items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        from kubernetes.client import ApiException

        assert (namespace, name) == CONFIG_MAP
        if self.config is None:
            raise ApiException(status=404)
        return type("CM", (), {"data": self.config})()

    # CustomObjectsApi
    def list_cluster_custom_object(self, group: str, version: str, plural: str) -> dict[str, Any]:
        return {"items": copy.deepcopy(list(self.slices.values()))}

    def patch_cluster_custom_object(
        self, group: str, version: str, plural: str, name: str, body: Mapping[str, Any]
    ) -> None:
        meta = self.slices[name]["metadata"]
        for key, value in body["metadata"].items():
            if key == "annotations":
                meta.setdefault("annotations", {}).update(value)
            elif value is None:
                meta.pop(key, None)
            else:
                meta[key] = value
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.slices[name]

    def patch_cluster_custom_object_status(
        self, group: str, version: str, plural: str, name: str, body: Mapping[str, Any]
    ) -> None:
        self.slices[name]["status"] = copy.deepcopy(dict(body["status"]))

    # test helpers
    def create(self, name: str, pids: Iterable[str], created: str, topology: str = "4x4x8") -> None:
        self.slices[name] = {
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"type": "tpu7x", "topology": topology, "partitionIds": list(pids)},
        }

    def delete(self, name: str) -> None:
        self.slices[name]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        if not self.slices[name]["metadata"].get("finalizers"):
            del self.slices[name]

    def reason(self, name: str) -> str:
        (cond,) = self.slices[name]["status"]["conditions"]
        return str(cond["reason"])

    def sliced(self) -> dict[str, str]:
        return {
            n: ls[SLICE_LABEL] + "/" + ls[TOPOLOGY_LABEL]
            for n, node in self.nodes.items()
            if SLICE_LABEL in (ls := node["metadata"]["labels"])
        }


def controller(api: FakeApi) -> SliceController:
    ctl = SliceController(None)
    ctl.core = api
    ctl.custom = api
    return ctl


def test_the_shell_forms_one_slice_refuses_a_rival_and_cleans_up_on_delete() -> None:
    api = FakeApi(block_nodes())
    ctl = controller(api)
    api.create("first", (A, B), "2026-01-01T00:00:00Z")
    api.create("rival", (B, A), "2026-01-01T00:00:01Z")
    ctl.reconcile_once(now=T0)
    assert api.reason("first") == ACTIVATING and api.reason("rival") == SLICE_CREATION_FAILED
    assert api.slices["first"]["metadata"]["finalizers"] == [FINALIZER]
    assert api.sliced() == {}
    ctl.reconcile_once(now=T0 + 3)  # default activation 3 s
    assert api.reason("first") == ACTIVE
    assert api.sliced() == {n: "first/4x4x8" for n in all_nodes()}
    assert ctl.reconcile_once(now=T0 + 4) == []  # formed: nothing more to do
    api.delete("first")
    ctl.reconcile_once(now=T0 + 5)
    assert "first" not in api.slices and api.sliced() == {}
    assert not any(TOPOLOGY_LABEL in n["metadata"]["labels"] for n in api.nodes.values())


def test_the_shell_frees_partitions_for_a_new_slice_once_the_old_one_is_deleted() -> None:
    api = FakeApi(block_nodes())
    ctl = controller(api)
    api.create("old", (A,), "2026-01-01T00:00:00Z", topology="4x4x4")
    ctl.reconcile_once(now=T0)
    api.create("new", (A,), "2026-01-01T00:00:05Z", topology="4x4x4")
    ctl.reconcile_once(now=T0 + 1)
    assert api.reason("new") == SLICE_CREATION_FAILED
    api.delete("old")
    api.create("next", (A,), "2026-01-01T00:00:09Z", topology="4x4x4")
    ctl.reconcile_once(now=T0 + 2)
    assert "old" not in api.slices and api.reason("next") == ACTIVATING


def test_the_shell_applies_configmap_rules_once_and_writes_the_fault_on_the_slice() -> None:
    api = FakeApi(block_nodes())
    api.config = {
        "faults": yaml.safe_dump([{"match": "f-*", "fault": "fail", "times": 1}]),
        "settings": yaml.safe_dump({"activationS": 0}),
    }
    ctl = controller(api)
    api.create("f-1", (A,), "2026-01-01T00:00:00Z", topology="4x4x4")
    api.create("f-2", (B,), "2026-01-01T00:00:01Z", topology="4x4x4")
    ctl.reconcile_once(now=T0)
    ctl.reconcile_once(now=T0)
    assert api.slices["f-1"]["metadata"]["annotations"] == {FAULT_ANNOTATION: "fail"}
    assert "annotations" not in api.slices["f-2"]["metadata"]
    assert api.reason("f-1") == FAILED and api.reason("f-2") == ACTIVE
    api.config = {"settings": "activationS: nope"}
    ctl.reconcile_once(now=T0)
    assert any("ConfigMap kube-system/tpusim-slicectl ignored" in e for e in ctl.events)


def test_partition_state_is_set_on_every_node_of_the_partition() -> None:
    api = FakeApi(block_nodes())
    changed = set_partition_state(api, A, "UNHEALTHY")  # the fake is its own CoreV1Api
    assert len(changed) == 16
    parts = partitions_of(api.nodes.values())
    assert parts[A].state == "UNHEALTHY" and parts[B].state == "HEALTHY"
    with pytest.raises(ValueError, match="must be one of"):
        set_partition_state(api, A, "BROKEN")
    with pytest.raises(ValueError, match="no node carries"):
        set_partition_state(api, "nope", "HEALTHY")


# ------------------------------------------------------------------ the command line


def _kubeconfig(tmp_path: Any) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def test_cli_refuses_an_activation_out_of_bounds(tmp_path: Any, capsys: Any) -> None:
    from tpusim.__main__ import main

    assert main(["slicectl", "--kubeconfig", _kubeconfig(tmp_path), "--activation", "-1"]) == 2
    assert "activationS -1.0 must be between 0 and 3600" in capsys.readouterr().err


def test_cli_slice_fault_takes_only_known_faults(tmp_path: Any) -> None:
    from tpusim.__main__ import main

    with pytest.raises(SystemExit):
        main(["slice-fault", "--kubeconfig", _kubeconfig(tmp_path), "s1", "explode"])


def test_the_python_api_fails_degrades_and_clears_a_slice() -> None:
    api = FakeApi(block_nodes())
    ctl = controller(api)
    api.create("s", (A, B), "2026-01-01T00:00:00Z")
    ctl.reconcile_once(now=T0)
    ctl.reconcile_once(now=T0 + 3)
    ctl.degrade("s")
    ctl.reconcile_once(now=T0 + 4)
    assert api.reason("s") == ACTIVE_DEGRADED
    ctl.clear("s")
    ctl.reconcile_once(now=T0 + 5)
    assert api.reason("s") == ACTIVE
    ctl.fail("s")
    ctl.reconcile_once(now=T0 + 6)
    assert api.reason("s") == FAILED
    ctl.clear("s")
    ctl.reconcile_once(now=T0 + 7)
    assert api.reason("s") == FAILED  # final without slice.gke.io/retry-on-failure
    with pytest.raises(ValueError, match="must be one of"):
        ctl.set_fault("s", "explode")
