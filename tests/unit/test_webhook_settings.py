"""The identity webhook's configuration settings: namespaceSelector, failurePolicy and
timeoutSeconds, from the ``tpuslice run`` flags into the MutatingWebhookConfiguration."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tpuslice.main.cli import main
from tpuslice.webhook import configuration as webhook_config


def _hook(**kwargs: Any) -> dict[str, Any]:
    cfg = webhook_config.webhook_configuration(ca_bundle=b"ca", url="https://127.0.0.1", **kwargs)
    (hook,) = cfg["webhooks"]
    return dict(hook)


def test_defaults_exclude_kube_system_and_fail_closed() -> None:
    hook = _hook()
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
        ]
    }
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Fail", 5)
    # the default is a fresh copy: a caller changing it changes no later configuration
    hook["namespaceSelector"]["matchExpressions"].clear()
    assert _hook()["namespaceSelector"]["matchExpressions"]


def test_settings_reach_the_configuration() -> None:
    selector = {"matchLabels": {"team": "ml"}, "matchExpressions": []}
    hook = _hook(timeout_seconds=12, failure_policy="Ignore", namespace_selector=selector)
    assert hook["namespaceSelector"] == selector, "given fields kept as given (chart parity)"
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 12)


@pytest.mark.parametrize(
    ("selector", "match"),
    [
        ([], "must be a label selector object"),
        ({"matchLabel": {}}, "unknown field.*matchLabel"),
        ({"matchLabels": {"a": 1}}, r"matchLabels must map"),
        ({"matchExpressions": [{"key": "k", "operator": "Is"}]}, r"\[0\]\.operator 'Is'"),
        ({"matchExpressions": [{"key": "k", "operator": "In"}]}, "needs at least one value"),
        ({"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["x"]}]}, "no values"),
        ({"matchExpressions": [{"operator": "Exists"}]}, r"\[0\]\.key must be"),
        ({"matchExpressions": [{"key": "k", "operator": "Exists"}] * 33}, "at most 32"),
        ({"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"] * 257}]}, "257"),
    ],
)
def test_a_bad_namespace_selector_names_the_field(selector: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        webhook_config.checked_namespace_selector(selector)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"failure_policy": "Maybe"}, "failurePolicy 'Maybe'"), ({"timeout_seconds": 31}, "1 and 30")],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _hook(**kwargs)


def test_parse_bounds_and_reports_json() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        webhook_config.parse_namespace_selector("{matchLabels: x}")
    with pytest.raises(ValueError, match="at most 16384"):
        webhook_config.parse_namespace_selector(" " * 20000)
    assert webhook_config.parse_namespace_selector("{}") == {}


def test_run_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import tpuslice.main.app

    seen: list[Any] = []
    monkeypatch.setattr(tpuslice.main.app, "run_operator", seen.append)
    assert main(["run"]) == 0
    assert seen[-1].webhook_namespace_selector is None  # the default: all but kube-system
    assert (seen[-1].webhook_failure_policy, seen[-1].webhook_timeout_seconds) == ("Fail", 5)
    selector = {"matchExpressions": [{"key": "team", "operator": "Exists"}]}
    flags = ["--webhook-timeout-seconds=9", "--webhook-failure-policy=Ignore"]
    assert main(["run", *flags, f"--webhook-namespace-selector={json.dumps(selector)}"]) == 0
    config = seen[-1]
    assert config.webhook_namespace_selector == selector
    assert (config.webhook_failure_policy, config.webhook_timeout_seconds) == ("Ignore", 9)


def test_bad_run_flags_exit_2_naming_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tpuslice.main.app

    seen: list[Any] = []
    monkeypatch.setattr(tpuslice.main.app, "run_operator", seen.append)
    code = main(["run", "--webhook-timeout-seconds=0", "--webhook-namespace-selector=[]"])
    assert code == 2 and not seen
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: --webhook-namespace-selector: webhook namespaceSelector must be a label "
        "selector object, got list",
        "error: --webhook-timeout-seconds: 0 must be between 1 and 30 (a Kubernetes limit)",
    ]
