"""The Pod Security Standards, baseline and restricted, judged on a pod template.

Source: "Pod Security Standards",
https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the Baseline and
Restricted tables: each control's restricted fields and allowed values). The checks
below are that page's controls, one function each, written from its tables; restricted
includes every baseline control, as the page says the levels are cumulative.

Each violation names the field a user edits, under the template's own path, e.g.
``spec.worker.template.spec.containers[0].securityContext.privileged``. A pod template
here is what the user wrote (the operator's own parts of a pod add no privilege and
no security setting), so a field the user left out is judged as absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tpuslice.policy.records import PodSecurityLevel

__all__ = ["Violation", "pod_security_violations"]

#: At most this many violations are reported per template (the first ones, in order).
MAX_VIOLATIONS = 32

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
SECCOMP_BASELINE = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


@dataclass(frozen=True)
class Violation:
    """One field of a pod template that breaks a Pod Security Standards control."""

    path: str
    control: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message} ({self.control})"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _containers(spec: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in CONTAINER_LISTS:
        items = spec.get(kind)
        if isinstance(items, list):
            for index, item in enumerate(items):
                yield f"{path}.{kind}[{index}]", _map(item)


@dataclass(frozen=True)
class _Pod:
    """The parts of a template each control reads, and where they are."""

    path: str  # the template's path, e.g. spec.worker.template
    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]

    @property
    def spec_path(self) -> str:
        return f"{self.path}.spec"

    @property
    def security(self) -> Mapping[str, Any]:
        return _map(self.spec.get("securityContext"))

    def containers(self) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
        """(path, container, its securityContext) of every container of every kind."""
        for where, container in _containers(self.spec, self.spec_path):
            yield where, container, _map(container.get("securityContext"))


Check = Callable[[_Pod], Iterator[Violation]]


# ------------------------------------------------------------------ baseline controls


def _host_process(pod: _Pod) -> Iterator[Violation]:
    control = "HostProcess"
    if _map(pod.security.get("windowsOptions")).get("hostProcess") is True:
        yield Violation(
            f"{pod.spec_path}.securityContext.windowsOptions.hostProcess",
            control,
            "must be unset or false",
        )
    for where, _, sc in pod.containers():
        if _map(sc.get("windowsOptions")).get("hostProcess") is True:
            yield Violation(
                f"{where}.securityContext.windowsOptions.hostProcess",
                control,
                "must be unset or false",
            )


def _host_namespaces(pod: _Pod) -> Iterator[Violation]:
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.spec.get(key) is True:
            yield Violation(
                f"{pod.spec_path}.{key}",
                "Host Namespaces",
                "must be unset or false (sharing the node's namespaces is not allowed)",
            )


def _privileged(pod: _Pod) -> Iterator[Violation]:
    for where, _, sc in pod.containers():
        if sc.get("privileged") is True:
            yield Violation(
                f"{where}.securityContext.privileged",
                "Privileged Containers",
                "must be unset or false",
            )


def _capabilities_added(pod: _Pod, allowed: frozenset[str], control: str) -> Iterator[Violation]:
    for where, _, sc in pod.containers():
        added = _map(sc.get("capabilities")).get("add")
        for index, cap in enumerate(added if isinstance(added, list) else []):
            if cap not in allowed:
                yield Violation(
                    f"{where}.securityContext.capabilities.add[{index}]",
                    control,
                    f"{cap!r} may not be added; allowed: {', '.join(sorted(allowed))}",
                )


def _capabilities(pod: _Pod) -> Iterator[Violation]:
    yield from _capabilities_added(pod, BASELINE_CAPABILITIES, "Capabilities")


def _host_path(pod: _Pod) -> Iterator[Violation]:
    volumes = pod.spec.get("volumes")
    for index, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if _map(volume).get("hostPath") is not None:
            yield Violation(
                f"{pod.spec_path}.volumes[{index}].hostPath",
                "HostPath Volumes",
                "hostPath volumes are not allowed",
            )


def _host_ports(pod: _Pod) -> Iterator[Violation]:
    for where, container, _ in pod.containers():
        ports = container.get("ports")
        for index, port in enumerate(ports if isinstance(ports, list) else []):
            if _map(port).get("hostPort") not in (None, 0):
                yield Violation(
                    f"{where}.ports[{index}].hostPort", "Host Ports", "must be unset or 0"
                )


def _apparmor(pod: _Pod) -> Iterator[Violation]:
    control = "AppArmor"
    contexts = [(f"{pod.spec_path}.securityContext", pod.security)]
    contexts += [(f"{where}.securityContext", sc) for where, _, sc in pod.containers()]
    for where, sc in contexts:
        kind = _map(sc.get("appArmorProfile")).get("type")
        if kind is not None and kind not in APPARMOR_TYPES:
            yield Violation(
                f"{where}.appArmorProfile.type",
                control,
                f"{kind!r} is not allowed; use RuntimeDefault or Localhost, or leave it unset",
            )
    for key, value in _map(pod.metadata.get("annotations")).items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or str(value).startswith("localhost/")
        ):
            yield Violation(
                f"{pod.path}.metadata.annotations.{key}",
                control,
                f"{value!r} is not allowed; use runtime/default or localhost/<profile>",
            )


def _selinux(pod: _Pod) -> Iterator[Violation]:
    control = "SELinux"
    contexts = [(f"{pod.spec_path}.securityContext", pod.security)]
    contexts += [(f"{where}.securityContext", sc) for where, _, sc in pod.containers()]
    for where, sc in contexts:
        options = _map(sc.get("seLinuxOptions"))
        kind = options.get("type")
        if kind is not None and kind not in SELINUX_TYPES:
            yield Violation(
                f"{where}.seLinuxOptions.type",
                control,
                f"{kind!r} is not allowed; use one of "
                f"{', '.join(sorted(t for t in SELINUX_TYPES if t))} or leave it unset",
            )
        for key in ("user", "role"):
            if options.get(key) not in (None, ""):
                yield Violation(f"{where}.seLinuxOptions.{key}", control, "must be unset or empty")


def _proc_mount(pod: _Pod) -> Iterator[Violation]:
    for where, _, sc in pod.containers():
        if sc.get("procMount") not in (None, "Default"):
            yield Violation(
                f"{where}.securityContext.procMount",
                "/proc Mount Type",
                "must be unset or Default",
            )


def _seccomp_baseline(pod: _Pod) -> Iterator[Violation]:
    contexts = [(f"{pod.spec_path}.securityContext", pod.security)]
    contexts += [(f"{where}.securityContext", sc) for where, _, sc in pod.containers()]
    for where, sc in contexts:
        kind = _map(sc.get("seccompProfile")).get("type")
        if kind is not None and kind not in SECCOMP_BASELINE:
            yield Violation(
                f"{where}.seccompProfile.type",
                "Seccomp",
                f"{kind!r} is not allowed; use RuntimeDefault or Localhost",
            )


def _sysctls(pod: _Pod) -> Iterator[Violation]:
    sysctls = pod.security.get("sysctls")
    for index, sysctl in enumerate(sysctls if isinstance(sysctls, list) else []):
        name = _map(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            yield Violation(
                f"{pod.spec_path}.securityContext.sysctls[{index}].name",
                "Sysctls",
                f"{name!r} is not one of the safe sysctls ({', '.join(sorted(SAFE_SYSCTLS))})",
            )


# ---------------------------------------------------------------- restricted controls


def _volume_types(pod: _Pod) -> Iterator[Violation]:
    volumes = pod.spec.get("volumes")
    for index, volume in enumerate(volumes if isinstance(volumes, list) else []):
        for key in _map(volume):
            if key != "name" and key not in RESTRICTED_VOLUME_TYPES and key != "hostPath":
                yield Violation(
                    f"{pod.spec_path}.volumes[{index}].{key}",
                    "Volume Types",
                    f"is not allowed; use one of {', '.join(sorted(RESTRICTED_VOLUME_TYPES))}",
                )


def _no_containers(pod: _Pod) -> Iterator[Violation]:
    """Restricted asks for settings on each container: a template that lists none cannot
    meet them (the operator's container gets no securityContext of its own)."""
    if not isinstance(pod.spec.get("containers"), list) or not pod.spec["containers"]:
        yield Violation(
            f"{pod.spec_path}.containers",
            "Privilege Escalation",
            "restricted needs each container's securityContext (allowPrivilegeEscalation: "
            "false, capabilities.drop [ALL]); list the container by name with them",
        )


def _privilege_escalation(pod: _Pod) -> Iterator[Violation]:
    for where, _, sc in pod.containers():
        if sc.get("allowPrivilegeEscalation") is not False:
            yield Violation(
                f"{where}.securityContext.allowPrivilegeEscalation",
                "Privilege Escalation",
                "must be false",
            )


def _run_as_non_root(pod: _Pod) -> Iterator[Violation]:
    control = "Running as Non-root"
    pod_level = pod.security.get("runAsNonRoot")
    if pod_level is False:
        yield Violation(f"{pod.spec_path}.securityContext.runAsNonRoot", control, "must be true")
    for where, _, sc in pod.containers():
        own = sc.get("runAsNonRoot")
        if own is False or (own is None and pod_level is not True):
            yield Violation(
                f"{where}.securityContext.runAsNonRoot",
                control,
                "must be true (here or in the pod's securityContext)",
            )


def _run_as_user(pod: _Pod) -> Iterator[Violation]:
    contexts = [(f"{pod.spec_path}.securityContext", pod.security)]
    contexts += [(f"{where}.securityContext", sc) for where, _, sc in pod.containers()]
    for where, sc in contexts:
        if sc.get("runAsUser") == 0:
            yield Violation(f"{where}.runAsUser", "Running as Non-root user", "must not be 0")


def _seccomp_restricted(pod: _Pod) -> Iterator[Violation]:
    pod_kind = _map(pod.security.get("seccompProfile")).get("type")
    for where, _, sc in pod.containers():
        own = _map(sc.get("seccompProfile")).get("type")
        if own is None and pod_kind is None:
            yield Violation(
                f"{where}.securityContext.seccompProfile.type",
                "Seccomp",
                "must be RuntimeDefault or Localhost (here or in the pod's securityContext)",
            )


def _capabilities_restricted(pod: _Pod) -> Iterator[Violation]:
    for where, _, sc in pod.containers():
        dropped = _map(sc.get("capabilities")).get("drop")
        if not isinstance(dropped, list) or "ALL" not in dropped:
            yield Violation(
                f"{where}.securityContext.capabilities.drop",
                "Capabilities",
                "must include ALL",
            )
    yield from _capabilities_added(pod, RESTRICTED_CAPABILITIES, "Capabilities")


BASELINE_CHECKS: tuple[Check, ...] = (
    _host_process,
    _host_namespaces,
    _privileged,
    _capabilities,
    _host_path,
    _host_ports,
    _apparmor,
    _selinux,
    _proc_mount,
    _seccomp_baseline,
    _sysctls,
)
RESTRICTED_CHECKS: tuple[Check, ...] = (
    _volume_types,
    _no_containers,
    _privilege_escalation,
    _run_as_non_root,
    _run_as_user,
    _seccomp_restricted,
    _capabilities_restricted,
)


def pod_security_violations(
    template: Mapping[str, Any], path: str, level: PodSecurityLevel
) -> list[Violation]:
    """Every field of the pod template at ``path`` that breaks ``level`` (at most
    MAX_VIOLATIONS; restricted reports its own controls after baseline's). Restricted's
    capability rule replaces baseline's allowed list, so baseline's is not run twice."""
    pod = _Pod(path=path, metadata=_map(template.get("metadata")), spec=_map(template.get("spec")))
    checks = BASELINE_CHECKS
    if level is PodSecurityLevel.RESTRICTED:
        checks = tuple(c for c in BASELINE_CHECKS if c is not _capabilities) + RESTRICTED_CHECKS
    found: list[Violation] = []
    for check in checks:
        for violation in check(pod):
            if len(found) >= MAX_VIOLATIONS:
                return found
            found.append(violation)
    return found
