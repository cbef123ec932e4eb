"""The Pod Security Standards checks (tpuslice.policy.podsecurity), one table row per
control and level: each bad case names its field, and the good case next to it (the
same template with the field fixed) passes, so no row can pass by accident.

The controls and allowed values are those of "Pod Security Standards",
https://kubernetes.io/docs/concepts/security/pod-security-standards/.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tpuslice.policy.podsecurity import MAX_VIOLATIONS, pod_security_violations
from tpuslice.policy.records import PodSecurityLevel

BASELINE = PodSecurityLevel.BASELINE
RESTRICTED = PodSecurityLevel.RESTRICTED
W = "spec.worker.template"
C0 = f"{W}.spec.containers[0]"


def restricted_ok() -> dict[str, Any]:
    """A worker template that meets restricted (and so baseline)."""
    return {
        "metadata": {"annotations": {}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "ray-worker",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }


def at(template: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """The template with ``value`` set at a dotted path (``[n]`` indexes a list)."""
    out = copy.deepcopy(template)
    node: Any = out
    parts = path.replace("[", ".[").split(".")
    for part, following in zip(parts, [*parts[1:], None], strict=True):
        key: Any = int(part[1:-1]) if part.startswith("[") else part
        if following is None:
            node[key] = value
        else:
            if isinstance(key, str) and key not in node:
                node[key] = [] if following.startswith("[") else {}
            node = node[key]
    return out


# (level, field set, bad value, good value, violation path under the template)
CASES: list[tuple[PodSecurityLevel, str, Any, Any, str]] = [
    (BASELINE, "spec.hostNetwork", True, False, "spec.hostNetwork"),
    (BASELINE, "spec.hostPID", True, False, "spec.hostPID"),
    (BASELINE, "spec.hostIPC", True, False, "spec.hostIPC"),
    (
        BASELINE,
        "spec.containers[0].securityContext.privileged",
        True,
        False,
        "spec.containers[0].securityContext.privileged",
    ),
    (
        BASELINE,
        "spec.initContainers",
        [{"name": "init", "securityContext": {"privileged": True}}],
        [{"name": "init", "securityContext": {"privileged": False}}],
        "spec.initContainers[0].securityContext.privileged",
    ),
    (
        BASELINE,
        "spec.securityContext.windowsOptions",
        {"hostProcess": True},
        {"hostProcess": False},
        "spec.securityContext.windowsOptions.hostProcess",
    ),
    (
        BASELINE,
        "spec.containers[0].securityContext.capabilities",
        {"add": ["SYS_ADMIN"]},
        {"add": ["CHOWN", "NET_BIND_SERVICE"]},
        "spec.containers[0].securityContext.capabilities.add[0]",
    ),
    (
        BASELINE,
        "spec.volumes",
        [{"name": "h", "hostPath": {"path": "/dev"}}],
        [{"name": "h", "emptyDir": {}}],
        "spec.volumes[0].hostPath",
    ),
    (
        BASELINE,
        "spec.containers[0].ports",
        [{"containerPort": 8265, "hostPort": 8265}],
        [{"containerPort": 8265, "hostPort": 0}],
        "spec.containers[0].ports[0].hostPort",
    ),
    (
        BASELINE,
        "spec.containers[0].securityContext.procMount",
        "Unmasked",
        "Default",
        "spec.containers[0].securityContext.procMount",
    ),
    (
        BASELINE,
        "spec.securityContext.seccompProfile",
        {"type": "Unconfined"},
        {"type": "Localhost", "localhostProfile": "p.json"},
        "spec.securityContext.seccompProfile.type",
    ),
    (
        BASELINE,
        "spec.containers[0].securityContext.seccompProfile",
        {"type": "Unconfined"},
        {"type": "RuntimeDefault"},
        "spec.containers[0].securityContext.seccompProfile.type",
    ),
    (
        BASELINE,
        "spec.securityContext.sysctls",
        [{"name": "kernel.msgmax", "value": "1"}],
        [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"}],
        "spec.securityContext.sysctls[0].name",
    ),
    (
        BASELINE,
        "spec.containers[0].securityContext.appArmorProfile",
        {"type": "Unconfined"},
        {"type": "RuntimeDefault"},
        "spec.containers[0].securityContext.appArmorProfile.type",
    ),
    (
        BASELINE,
        "metadata.annotations",
        {"container.apparmor.security.beta.kubernetes.io/ray-worker": "unconfined"},
        {"container.apparmor.security.beta.kubernetes.io/ray-worker": "localhost/p"},
        "metadata.annotations.container.apparmor.security.beta.kubernetes.io/ray-worker",
    ),
    (
        BASELINE,
        "spec.securityContext.seLinuxOptions",
        {"type": "spc_t"},
        {"type": "container_t"},
        "spec.securityContext.seLinuxOptions.type",
    ),
    (
        BASELINE,
        "spec.containers[0].securityContext.seLinuxOptions",
        {"user": "system_u"},
        {"level": "s0:c1"},
        "spec.containers[0].securityContext.seLinuxOptions.user",
    ),
    (
        RESTRICTED,
        "spec.volumes",
        [{"name": "n", "nfs": {"server": "s", "path": "/"}}],
        [{"name": "n", "persistentVolumeClaim": {"claimName": "c"}}],
        "spec.volumes[0].nfs",
    ),
    (
        RESTRICTED,
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
        True,
        False,
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
    ),
    (
        RESTRICTED,
        "spec.securityContext.runAsNonRoot",
        None,
        True,
        "spec.containers[0].securityContext.runAsNonRoot",
    ),
    (
        RESTRICTED,
        "spec.containers[0].securityContext.runAsNonRoot",
        False,
        True,
        "spec.containers[0].securityContext.runAsNonRoot",
    ),
    (
        RESTRICTED,
        "spec.securityContext.runAsUser",
        0,
        1000,
        "spec.securityContext.runAsUser",
    ),
    (
        RESTRICTED,
        "spec.securityContext.seccompProfile",
        None,
        {"type": "RuntimeDefault"},
        "spec.containers[0].securityContext.seccompProfile.type",
    ),
    (
        RESTRICTED,
        "spec.containers[0].securityContext.capabilities",
        {"drop": ["NET_RAW"]},
        {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        "spec.containers[0].securityContext.capabilities.drop",
    ),
    (
        RESTRICTED,
        "spec.containers[0].securityContext.capabilities",
        {"drop": ["ALL"], "add": ["CHOWN"]},
        {"drop": ["ALL"]},
        "spec.containers[0].securityContext.capabilities.add[0]",
    ),
    (
        RESTRICTED,
        "spec.containers",
        [],
        [restricted_ok()["spec"]["containers"][0]],
        "spec.containers",
    ),
]


def _without_none(template: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``at``, except that None removes the field (an unset field)."""
    if value is not None:
        return at(template, path, value)
    out = at(template, path, "x")
    *parents, last = path.replace("[", ".[").split(".")
    node: Any = out
    for part in parents:
        node = node[int(part[1:-1]) if part.startswith("[") else part]
    del node[last]
    return out


@pytest.mark.parametrize(
    ("level", "field", "bad", "good", "violation"),
    CASES,
    ids=[f"{c[0]}-{c[1]}-{c[4].rsplit('.', 1)[-1]}" for c in CASES],
)
def test_each_control(
    level: PodSecurityLevel, field: str, bad: Any, good: Any, violation: str
) -> None:
    bad_template = _without_none(restricted_ok(), field, bad)
    found = pod_security_violations(bad_template, W, level)
    assert f"{W}.{violation}" in [v.path for v in found], [str(v) for v in found]
    good_template = _without_none(restricted_ok(), field, good)
    assert pod_security_violations(good_template, W, level) == []


@pytest.mark.parametrize(
    "field",
    [
        "spec.securityContext.runAsNonRoot",
        "spec.securityContext.seccompProfile",
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
        "spec.containers[0].securityContext.capabilities",
    ],
)
def test_restricted_only_fields_are_fine_at_baseline(field: str) -> None:
    loose = _without_none(restricted_ok(), field, None)
    assert pod_security_violations(loose, W, RESTRICTED) != []
    assert pod_security_violations(loose, W, BASELINE) == []


def test_baseline_allows_the_default_pod() -> None:
    assert pod_security_violations({}, W, BASELINE) == []
    assert pod_security_violations({"spec": {"containers": [{"name": "c"}]}}, W, BASELINE) == []


def test_a_violation_names_the_field_the_control_and_the_fix() -> None:
    template = at(restricted_ok(), "spec.containers[0].securityContext.privileged", True)
    (violation,) = pod_security_violations(template, W, BASELINE)
    assert str(violation) == (
        f"{C0}.securityContext.privileged: must be unset or false (Privileged Containers)"
    )


def test_every_container_kind_is_judged() -> None:
    template = restricted_ok()
    template["spec"]["ephemeralContainers"] = [{"name": "debug"}]
    paths = [v.path for v in pod_security_violations(template, W, RESTRICTED)]
    assert f"{W}.spec.ephemeralContainers[0].securityContext.allowPrivilegeEscalation" in paths


def test_violations_are_bounded() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": f"c{i}", "securityContext": {"privileged": True}} for i in range(100)
            ]
        }
    }
    assert len(pod_security_violations(template, W, BASELINE)) == MAX_VIOLATIONS


def test_wrong_types_are_ignored_not_crashed_on() -> None:
    template = {"spec": {"containers": "nope", "volumes": {"a": 1}, "securityContext": []}}
    assert pod_security_violations(template, W, BASELINE) == []
