"""What the benchmark creates, checked against the product's published surface: its CRDs
(crds/) and its `tpuslice render` command, never its Python modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from bench import operator_api as c
from bench.scenario import GANG_HOSTS, GANG_SLICES, HOSTS, gang_tsc, rendered_rayclusters, tsc

REPO = Path(__file__).resolve().parents[3]

# Renders like `tpuslice render -f -` in shape (one RayCluster per document, in order),
# and fails like it (status 2, the problem on stderr) on a document named "bad".
STAND_IN = """\
#!{python}
import sys, yaml
assert sys.argv[1:] == ["render", "-f", "-"], sys.argv
docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
if any(d["metadata"]["name"] == "bad" for d in docs):
    sys.exit("stdin document 1 (bad): spec.tpu.type: unknown")
out = [{{"kind": "RayCluster", "metadata": {{"name": d["metadata"]["name"]}}}} for d in docs]
sys.stdout.write(yaml.safe_dump_all(out))
"""


def _crd(plural: str) -> dict[str, object]:
    crd = yaml.safe_load((REPO / "crds" / f"{c.GROUP}_{plural}.yaml").read_text())
    assert isinstance(crd, dict)
    return crd


def test_the_api_names_mirror_the_published_crds() -> None:
    crd = _crd(c.PLURAL_CLUSTER)
    spec = crd["spec"]
    assert isinstance(spec, dict)
    assert spec["group"] == c.GROUP
    assert spec["names"]["kind"] == c.KIND_CLUSTER
    assert spec["names"]["plural"] == c.PLURAL_CLUSTER
    assert c.VERSION in [v["name"] for v in spec["versions"] if v["served"]]
    reservations = _crd(c.PLURAL_RESERVATION)["spec"]
    assert isinstance(reservations, dict)
    assert reservations["names"]["plural"] == c.PLURAL_RESERVATION
    assert f"{c.GROUP}/{c.VERSION}" == c.API_VERSION


def test_rendering_asks_the_console_script_beside_the_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = sys.executable
    script = tmp_path / "tpuslice"
    script.write_text(STAND_IN.format(python=python))
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    rendered = rendered_rayclusters([tsc("b0001"), tsc("b0000")])
    assert [r["metadata"]["name"] for r in rendered] == ["b0001", "b0000"]
    with pytest.raises(RuntimeError, match=r"exited 1: stdin document 1 \(bad\)"):
        rendered_rayclusters([tsc("bad")])


def test_the_product_renders_the_benchmarks_clusters() -> None:
    """The real `tpuslice render`: the benchmark's TSCs are valid for the operator, and the
    RayClusters have the shape the recorders count on (hosts per slice, slices per gang,
    the gate a reserved slice's workers wait behind)."""
    direct, gated, gang = rendered_rayclusters(
        [tsc("b0000", gated=False), tsc("b0001"), gang_tsc("g0000")]
    )
    assert [r["kind"] for r in (direct, gated, gang)] == ["RayCluster"] * 3
    assert direct["metadata"]["name"] == "b0000"
    (workers,) = direct["spec"]["workerGroupSpecs"]
    assert (workers["replicas"], workers["numOfHosts"]) == (1, HOSTS)
    assert not workers["template"]["spec"].get("schedulingGates")
    (workers,) = gated["spec"]["workerGroupSpecs"]
    assert workers["template"]["spec"]["schedulingGates"] == [{"name": c.SCHEDULING_GATE}]
    (workers,) = gang["spec"]["workerGroupSpecs"]
    assert (workers["replicas"], workers["numOfHosts"]) == (GANG_SLICES, GANG_HOSTS)


def test_the_operator_takes_every_flag_the_scales_pass() -> None:
    """The flags each scale gives the operator are the real `tpuslice run`'s (its help,
    from the console script beside the interpreter), within the bounds it states."""
    import subprocess

    from bench.runs import batch_args
    from bench.scenario import SCALES
    from tpusim.operator_process import tpuslice_command

    command = str(tpuslice_command())
    done = subprocess.run([command, "run", "--help"], capture_output=True, text=True, check=True)
    assert SCALES["large"].status_batch_seconds == 60  # the setting performance.md names
    assert batch_args(SCALES["small"]) == ()
    for scale in SCALES.values():
        for flag in batch_args(scale):
            # argparse answers --help before it refuses an unknown flag, so the help
            # text is what says the flag exists; the value is checked on the way
            assert flag.split("=", 1)[0] in done.stdout, flag
            checked = subprocess.run(
                [command, "run", flag, "--help"], capture_output=True, text=True, check=False
            )
            assert checked.returncode == 0, checked.stderr
