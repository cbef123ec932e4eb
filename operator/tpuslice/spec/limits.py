"""The slices and hosts one object asks for, judged against ``bounds.SpecLimits``."""

from __future__ import annotations

from tpuslice.spec.bounds import CEILING, SpecLimits
from tpuslice.spec.parts import FieldError, SliceClusterSpec, SpecError

__all__ = ["RAISE_HOSTS", "RAISE_SLICES", "check_limits", "controller_errors", "limit_errors"]

#: The operator settings that raise each limit (named in the messages).
RAISE_SLICES = "--max-slices-per-object (Helm value limits.maxSlicesPerObject)"
RAISE_HOSTS = "--max-hosts-per-object (Helm value limits.maxHostsPerObject)"


def _fix(what: str, limit: int, ceiling: int, setting: str) -> str:
    """The way out: fewer, and, below the ceiling, the setting an admin can raise."""
    if limit < ceiling:
        return f"use {what}, or have the operator's {setting} raised"
    return f"use {what}"


def limit_errors(spec: SliceClusterSpec, limits: SpecLimits) -> list[FieldError]:
    """What of ``spec`` is over ``limits``: spec.tpu.slices, and the hosts it makes (one
    worker pod each). A suspended spec is judged too: resuming it must not be the moment
    it turns out to be too big."""
    errors: list[FieldError] = []
    # an elastic object is judged at its maximum, the most the autoscaler may reach
    path = "spec.tpu.slices" if spec.elastic is None else "spec.elastic.maxSlices"
    if spec.grouped:
        path = "spec.workerGroups"  # judged over every TPU group together
    if spec.slices > limits.max_slices:
        fix = _fix("fewer slices", limits.max_slices, CEILING.max_slices, RAISE_SLICES)
        errors.append(
            FieldError(
                path,
                f"{spec.slices} is more than the {limits.max_slices} slices this operator "
                f"allows one object; {fix}",
            )
        )
    hosts = sum(group.slices * group.shape.hosts for group in spec.tpu_groups())
    if spec.grouped and hosts > limits.max_hosts:
        fix = _fix("fewer or smaller slices", limits.max_hosts, CEILING.max_hosts, RAISE_HOSTS)
        errors.append(
            FieldError(
                path,
                f"the TPU groups' slices are {hosts} hosts (one worker pod each), more than "
                f"the {limits.max_hosts} this operator allows one object; {fix}",
            )
        )
    elif hosts > limits.max_hosts:
        fix = _fix("fewer or smaller slices", limits.max_hosts, CEILING.max_hosts, RAISE_HOSTS)
        errors.append(
            FieldError(
                path,
                f"{spec.slices} slices of {spec.shape.hosts} hosts ({spec.shape.topology}) "
                f"are {hosts} hosts (one worker pod each), more than the {limits.max_hosts} "
                f"this operator allows one object; {fix}",
            )
        )
    return errors


def check_limits(spec: SliceClusterSpec, limits: SpecLimits) -> None:
    """Raise SpecError (the pass ends InvalidSpec) when ``spec`` is over ``limits``."""
    errors = limit_errors(spec, limits)
    if errors:
        raise SpecError(errors)


def controller_errors(spec: SliceClusterSpec) -> list[FieldError]:
    """What of ``spec`` the operator renders but does not reserve and account for.

    Every kind's TPU groups are each a slice set in its own shape's queue
    (docs/architecture.md, "Several worker groups: reservation"). Not yet run: capacity
    on demand for groups (one ProvisioningRequest per object), and two Joined TPU groups of one
    shape in a gang across groups (a gang claims each shape at once, and two groups of
    one shape are two requests there, which could each hold part of the shape)."""
    if not (spec.grouped and spec.gated):
        return []
    if spec.provisions:
        return [
            FieldError(
                "spec.reservation.provisioning",
                "is not run for spec.workerGroups yet (a ProvisioningRequest is made per "
                "object, not per group); remove provisioning, or use spec.tpu and spec.worker",
            )
        ]
    seen: dict[tuple[str, str], str] = {}
    for group in spec.gang_groups():
        shape = (group.shape.generation.gke_accelerator, group.shape.topology)
        if shape in seen:
            return [
                FieldError(
                    "spec.workerGroups",
                    f"groups {seen[shape]} and {group.group_name} are both "
                    f"{group.shape.generation.name} {group.shape.topology} in one gang across "
                    "groups; set tpu.gang "
                    "Independent on one of them, or make them one group",
                )
            ]
        seen[shape] = group.group_name
    return []
