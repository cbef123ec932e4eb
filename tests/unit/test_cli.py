"""The tpuslice command as a user runs it: exit codes, stdout and stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuslice.main.cli import main

EXAMPLES = Path(__file__).parents[2] / "examples"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse usage errors and --help
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_topology_json_has_exactly_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "topology", "--type", "v6e", "--topology", "4x4", "-o", "json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "generation": "v6e",
        "gkeAccelerator": "tpu-v6e-slice",
        "topology": "4x4",
        "chips": 16,
        "chipsPerHost": 4,
        "hosts": 4,
        "acceleratorType": "v6e-16",
        "multiHost": True,
    }


def test_topology_yaml_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "topology",
        "--type",
        "v5e",
        "--topology",
        "2x4",
        "--chips-per-host",
        "4",
        "-o",
        "yaml",
    )
    assert code == 0 and yaml.safe_load(out)["hosts"] == 2
    code, out, _ = run(capsys, "topology", "--type", "tpu-v4-podslice", "--topology", "2x2x2")
    assert code == 0
    assert "ACCELERATORTYPE  v4-16" in out and "MULTIHOST        True" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--type", "v9", "--topology", "4x4"], "error: --type: unknown TPU type 'v9'"),
        (["--type", "v6e", "--topology", "4x4x4"], "error: --topology: v6e topologies have 2"),
        (
            ["--type", "v6e", "--topology", "4x4", "--chips-per-host", "8"],
            "error: --chips-per-host: v6e 4x4 cannot be built from 8-chip hosts",
        ),
    ],
)
def test_topology_invalid_input(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "topology", *argv)
    assert code == 2 and out == ""
    assert message in err


def test_render_multi_document_prints_one_raycluster_each(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    combined = tmp_path / "two.yaml"
    combined.write_text(
        (EXAMPLES / "v4-2x2x2.yaml").read_text()
        + "\n---\n"
        + (EXAMPLES / "v6e-4x4-two-slices.yaml").read_text()
    )
    code, out, err = run(capsys, "render", "-f", str(combined))
    assert (code, err) == (0, "")
    docs = list(yaml.safe_load_all(out))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("RayCluster", "v4-small"),
        ("RayCluster", "llm"),
    ]


def test_render_reads_every_kind(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    combined = tmp_path / "three.yaml"
    combined.write_text(
        "\n---\n".join(
            (EXAMPLES / name).read_text()
            for name in (
                "v6e-4x4-two-slices.yaml",
                "job-v6e-4x4-training.yaml",
                "service-v6e-4x4-serve.yaml",
            )
        )
    )
    code, out, err = run(capsys, "render", "-f", str(combined))
    assert (code, err) == (0, "")
    docs = list(yaml.safe_load_all(out))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("RayCluster", "llm"),
        ("RayJob", "train-llm"),
        ("RayService", "llm-serve"),
    ]
    # multi-line strings come out as the literal blocks users write, and read back equal
    assert "serveConfigV2: |\n" in out
    source = yaml.safe_load((EXAMPLES / "service-v6e-4x4-serve.yaml").read_text())
    assert docs[2]["spec"]["serveConfigV2"] == source["spec"]["serve"]["serveConfigV2"]


def test_render_reports_every_problem_and_prints_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (EXAMPLES / "v4-2x2x2.yaml").read_text()
        + "\n---\napiVersion: tpuslice.dev/v1alpha1\nkind: TPUSliceCluster\n"
        "metadata: {name: broken}\nspec:\n  tpu: {type: v6e, topology: 3x3}\n"
        "  ray: {version: '2.50.0'}\n"
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"
    )
    code, out, err = run(capsys, "render", "-f", str(bad))
    assert code == 2 and out == ""
    assert "document 2 (broken): spec.tpu.topology: v6e has no 3x3 slice" in err
    assert "document 2 (broken): spec.ray.version: Ray 2.50.0 is older than 2.54.0" in err
    assert (
        "document 3: kind 'ConfigMap' is not TPUSliceCluster, TPUSliceJob or TPUSliceService" in err
    )


def test_render_missing_file_and_bad_yaml(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "render", "-f", str(tmp_path / "nope.yaml"))
    assert code == 2 and out == "" and "No such file or directory" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    code, out, err = run(capsys, "render", "-f", str(broken))
    assert code == 2 and out == "" and "not valid YAML" in err


def test_render_empty_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    code, out, err = run(capsys, "render", "-f", str(empty))
    assert (
        code == 2
        and out == ""
        and "no TPUSliceCluster, TPUSliceJob or TPUSliceService found" in err
    )


@pytest.mark.parametrize("argv", [[], ["topology"], ["render"]])
def test_help_on_every_command(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0 and "usage: tpuslice" in out


def test_console_script_reads_stdin() -> None:
    """The installed entry point, end to end, with the README's pipe."""
    result = subprocess.run(
        [sys.executable, "-m", "tpuslice.main.cli", "render", "-f", "-"],
        input=(EXAMPLES / "v6e-4x4-two-slices.yaml").read_text(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["spec"]["workerGroupSpecs"][0]["numOfHosts"] == 4


def test_lease_namespace_flag_then_pod_then_service_account_then_context(
    tmp_path: Path,
) -> None:
    from tpuslice.main.cli import lease_namespace

    sa = tmp_path / "namespace"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://x"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [
                    {"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}
                ],
                "current-context": "c",
            }
        )
    )
    env = {"POD_NAMESPACE": "ops"}
    assert lease_namespace("mine", env, None, service_account_file=sa) == "mine"
    assert lease_namespace(None, env, None, service_account_file=sa) == "ops"
    sa.write_text("in-pod\n")
    assert lease_namespace(None, {}, None, service_account_file=sa) == "in-pod"
    assert lease_namespace(None, {}, str(kubeconfig), service_account_file=sa) == "ml"
    assert lease_namespace(None, {}, str(tmp_path / "none"), service_account_file=sa) == "default"


def test_run_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import tpuslice.main.app

    seen: list[Any] = []
    monkeypatch.setattr(tpuslice.main.app, "run_operator", seen.append)
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    assert main(["run", "--webhook-secret=certs", "--sweep-seconds=2"]) == 0
    (config,) = seen
    assert config.leader_elect is True  # on by default, out of cluster too
    assert (config.lease_namespace, config.lease_name) == ("ops", "tpuslice-operator")
    assert config.webhook_secret == "certs" and config.sweep_seconds == 2
    assert config.shutdown_drain_seconds == 5
    seen.clear()
    main(["run", "--no-leader-elect", "--leader-elect-lease-name=other"])
    assert seen[0].leader_elect is False and seen[0].lease_name == "other"


def test_kueue_pods_ready_flags_reach_the_config(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tpuslice.main.app

    seen: list[Any] = []
    monkeypatch.setattr(tpuslice.main.app, "run_operator", seen.append)
    assert main(["run"]) == 0
    assert (seen[0].kueue_pods_ready_timeout_s, seen[0].kueue_pods_ready_recovery_timeout_s) == (
        0,
        None,
    )
    seen.clear()
    argv = ["run", "--kueue-pods-ready-timeout=600", "--kueue-pods-ready-recovery-timeout=0"]
    assert main(argv) == 0
    assert (seen[0].kueue_pods_ready_timeout_s, seen[0].kueue_pods_ready_recovery_timeout_s) == (
        600,
        0,
    )
    with pytest.raises(SystemExit):
        main(["run", "--kueue-pods-ready-timeout=-1"])
    assert "must be from 0 to" in capsys.readouterr().err
