"""Random TPUSliceClusters for the fuzz tiers: valid bases, then faults a careless or
hostile user would make.

Two producers share the ideas: hypothesis strategies (unit tier, shrinking) and a
seeded ``random.Random`` generator (e2e tier, through ``kubectl apply``, where a
run must be reproducible from its seed alone). Both draw field names from the
schemas themselves (our CRD, KubeRay's pod template), so faults land on real
fields at every depth, not only on made-up keys.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

#: A valid starting point per generation (small slices, so e2e runs stay light).
BASES: tuple[dict[str, Any], ...] = (
    {"type": "v6e", "topology": "4x4"},
    {"type": "v6e", "topology": "2x2"},
    {"type": "v5e", "topology": "2x4", "chipsPerHost": 4},
    {"type": "v4", "topology": "2x2x2"},
    {"type": "v5p", "topology": "2x2x1"},
    {"type": "tpu7x", "topology": "2x2x2"},
    {"type": "tpu-v6e-slice", "topology": "2x4"},
)

SCALARS: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    1,
    7,
    2**31,
    2**63,
    0.5,
    1.0,
    "",
    "yes",
    "4x4",
    "8Gi",
    "500m",
    "lots",
    "v6e",
    "ray-worker",
    "ray-head",
    "google.com/tpu",
    "tpuslice.dev/slice-reservation",
    "x" * 300,
)


def base_cluster(name: str, tpu: Mapping[str, Any], slices: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "tpuslice.dev/v1alpha1",
        "kind": "TPUSliceCluster",
        "metadata": {"name": name},
        "spec": {
            "tpu": {**tpu, "slices": slices},
            "ray": {"version": "2.54.0"},
            "head": {"resources": {"cpu": "1", "memory": "2Gi"}},
            "worker": {"resources": {"cpu": "4", "memory": "16Gi"}},
        },
    }


# ------------------------------------------------------------------ hypothesis
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(SCALARS),
)


def json_values(keys: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[Any]:
    """Arbitrary JSON-like values; map keys from ``keys`` (real field names) or any text."""
    key = st.one_of(keys, st.text(max_size=8)) if keys is not None else st.text(max_size=8)
    return st.recursive(
        json_scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(key, inner, max_size=4)
        ),
        max_leaves=12,
    )


_STRATEGIES: dict[tuple[int, int], st.SearchStrategy[Any]] = {}
_ARBITRARY = json_values()


def from_schema(schema: Mapping[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Mostly well-formed values of ``schema`` (a compacted structural schema), each node
    replaced by an arbitrary JSON value now and then, so faults reach every depth.
    Memoised per schema node (the schema objects live as long as the process)."""
    key = (id(schema), depth)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = _from_schema(schema, depth)
    return _STRATEGIES[key]


def _from_schema(schema: Mapping[str, Any], depth: int) -> st.SearchStrategy[Any]:
    arbitrary = _ARBITRARY
    kind = schema.get("type")
    if depth > 6:
        return arbitrary
    if kind == "object" and schema.get("properties"):
        props = schema["properties"]
        names = sorted(props)
        fields = st.lists(st.sampled_from(names), max_size=3, unique=True).flatmap(
            lambda chosen: st.fixed_dictionaries(
                {n: from_schema(props[n], depth + 1) for n in chosen}
            )
        )
        return st.one_of(fields, fields, fields, arbitrary)
    if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
        values = from_schema(schema["additionalProperties"], depth + 1)
        return st.one_of(st.dictionaries(st.text(max_size=8), values, max_size=3), arbitrary)
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        items = from_schema(schema["items"], depth + 1)
        named = items.map(_with_name)
        return st.one_of(st.lists(named, max_size=3), st.lists(items, max_size=3), arbitrary)
    if schema.get("x-kubernetes-int-or-string"):
        return st.one_of(st.sampled_from(["1", "500m", "8Gi", 2, "lots"]), arbitrary)
    leaf = {
        "string": st.one_of(st.text(max_size=10), st.sampled_from(["ray-worker", "a", "TCP"])),
        "integer": st.integers(min_value=-5, max_value=2**33),
        "boolean": st.booleans(),
        "number": st.floats(allow_nan=False, allow_infinity=False),
    }.get(str(kind), arbitrary)
    return st.one_of(leaf, leaf, leaf, arbitrary)


_NAMES = ["ray-worker", "ray-head", "side", "a", "tpuslice.dev/slice-reservation"]


def _with_name(item: Any) -> Any:
    """List items of pod templates are mostly named; some names collide with ours."""
    if isinstance(item, dict) and "name" not in item:
        return {**item, "name": _NAMES[len(item) % len(_NAMES)]}
    return item


def mutations(obj: Any, value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``obj`` with one node (chosen by a drawn path) replaced by a drawn value, or a key
    added next to it."""

    def paths(node: Any, prefix: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        out = [prefix]
        if isinstance(node, dict):
            for k, v in node.items():
                out += paths(v, (*prefix, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                out += paths(v, (*prefix, i))
        return out

    every = paths(obj, ())

    @st.composite
    def mutate(draw: st.DrawFn) -> Any:
        path = draw(st.sampled_from(every))
        new = draw(value)
        out = copy.deepcopy(obj)
        if not path:
            return new
        parent = out
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()) and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = new
        else:
            parent[path[-1]] = new
        return out

    return mutate()


# ------------------------------------------------------------------ seeded (e2e)
class SpecFaults:
    """Seeded random specs: a valid base with 0-3 faults, each fault described.

    ``template_fields`` maps a pod-template path prefix (``spec``, ``container``) to
    the real field names under it, so template faults hit real fields.
    """

    def __init__(self, seed: int, template_fields: Mapping[str, list[str]]) -> None:
        self.rng = random.Random(seed)
        self.fields = template_fields

    def value(self, depth: int = 0) -> Any:
        rng = self.rng
        roll = rng.random()
        if depth > 2 or roll < 0.6:
            return rng.choice(SCALARS)
        if roll < 0.8:
            return [self.value(depth + 1) for _ in range(rng.randint(0, 2))]
        return {
            rng.choice(["name", "a", "cpu", "key", "value"]): self.value(depth + 1)
            for _ in range(rng.randint(0, 2))
        }

    def spec(self, name: str) -> tuple[dict[str, Any], list[str]]:
        rng = self.rng
        body = base_cluster(name, rng.choice(BASES), slices=rng.choice([1, 1, 1, 2]))
        spec = body["spec"]
        if rng.random() < 0.3:
            spec["reservation"] = {"policy": rng.choice(["NodePool", "None"])}
        if rng.random() < 0.5:
            spec["suspend"] = True
        faults: list[str] = []
        for _ in range(rng.choice([0, 1, 1, 2, 2, 3])):
            faults.append(self.fault(body))
        return body, faults

    def fault(self, body: dict[str, Any]) -> str:
        rng = self.rng
        spec = body["spec"]
        kind = rng.choice(
            [
                "tpu",
                "tpu",
                "slices",
                "ray",
                "resources",
                "name",
                "unknown",
                "policy",
                "suspend",
                "template",
                "template",
                "template",
                "template",
                "owned",
                "named",
                "start-params",
            ]
        )
        if kind == "tpu":
            key = rng.choice(["type", "topology", "chipsPerHost"])
            spec["tpu"][key] = rng.choice(
                ["v9", "4x4x4", "2x2x3", "1x1", "0x4", 8, 3, "", "tpu-v4-podslice", "16x16"]
            )
            return f"tpu.{key}"
        if kind == "slices":
            spec["tpu"]["slices"] = rng.choice([0, -1, 4097, "2", 2.5, None, 9])
            return "slices"
        if kind == "ray":
            key = rng.choice(["version", "image"])
            spec["ray"][key] = rng.choice(["2.53.0", "2.54", "3.0.0", "latest", 2.54, "x" * 600])
            return f"ray.{key}"
        if kind == "resources":
            group = rng.choice(["head", "worker"])
            spec[group]["resources"] = rng.choice(
                [{"cpu": "lots"}, {"google.com/tpu": 4}, {"memory": -1}, "8Gi", {"cpu": None}]
            )
            return f"{group}.resources"
        if kind == "name":
            name = body["metadata"]["name"]
            body["metadata"]["name"] = rng.choice(
                [
                    name.upper(),
                    f"{name}-{'x' * 50}",
                    f"1{name}",
                    name.replace("-", "_"),
                    f"{name}-ok",
                ]
            )
            return "metadata.name"
        if kind == "unknown":
            where = rng.choice([spec, spec["tpu"], spec["ray"], spec["worker"]])
            where[rng.choice(["slice", "wroker", "extra", "tpus"])] = self.value()
            return "unknown field"
        if kind == "policy":
            spec["reservation"] = {"policy": rng.choice(["Whole", "none", 1, None])}
            return "reservation.policy"
        if kind == "suspend":
            spec["suspend"] = rng.choice(["yes", 1, None, "false"])
            return "suspend"
        group = rng.choice(["head", "worker"])
        template = spec[group].setdefault("template", {})
        pod = template.setdefault("spec", {})
        if kind == "owned":
            choice = rng.randrange(4)
            if choice == 0:
                pod["nodeSelector"] = {"cloud.google.com/gke-tpu-topology": "8x8"}
            elif choice == 1:
                template.setdefault("metadata", {})["labels"] = {"tpuslice.dev/cluster": "other"}
            elif choice == 2:
                pod["schedulingGates"] = [{"name": "tpuslice.dev/slice-reservation"}]
            else:
                pod["nodeSelector"] = {"cloud.google.com/gke-nodepool": "mine"}
            return f"{group}.template owned field"
        if kind == "named":
            listed = rng.choice(["containers", "initContainers", "volumes", "schedulingGates"])
            pod[listed] = [{"name": rng.choice([{"a": "b"}, ["x"], 5, None, "dup", "dup"])}]
            return f"{group}.template {listed}[].name"
        if kind == "start-params":
            spec[group]["rayStartParams"] = rng.choice(
                [{"num-cpus": 4}, {"a": {"b": "c"}}, "x", {"block": "true"}]
            )
            return f"{group}.rayStartParams"
        # a real field of the pod spec or of the Ray container, set to a random value
        if rng.random() < 0.5:
            pod[rng.choice(self.fields["spec"])] = self.value()
            return f"{group}.template.spec field"
        container = {"name": rng.choice(["ray-worker", "ray-head", "side"])}
        container[rng.choice(self.fields["container"])] = self.value()
        pod["containers"] = [container]
        return f"{group}.template container field"
