"""docs/deploy.md's recipes as they appear there: the systemd units pass ``systemd-analyze
verify``, the Kubernetes manifests Kubernetes' own schemas, and the two agree on the timings
the dispatcher needs (measured in tests/integration/test_deploy.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deploy.md"
# the Kubernetes releases the manifests are checked against: the oldest still supported
# upstream when written, and the newest the validator knows
KUBERNETES = ["1.32.0", kubernetes_validate.utils.latest_version()]
# what tests/integration/test_deploy.py measures stays under these, and the page says so
HAND_OVER_BOUND_SECONDS = 15  # SIGTERM to exit, for a dispatcher releasing a stream of tasks
CHECK_BOUND_SECONDS = 15  # dispatch --check with Kafka, Cassandra and the broker unreachable


def blocks(language: str, text: str | None = None) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text or DOC.read_text(), re.M | re.S)


def units() -> dict[str, str]:
    found = {}
    for block in blocks("ini"):
        first, _, body = block.partition("\n")
        found[first.removeprefix("# /etc/systemd/system/")] = body
    return found


def manifests() -> list[dict[str, Any]]:
    return [doc for block in blocks("yaml") for doc in yaml.safe_load_all(block) if doc]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in manifests() if doc["kind"] == kind]


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze is not installed (scripts/test installs Debian's systemd)")
        pytest.skip("systemd-analyze is not installed: scripts/debian-install systemd")
    return found


def test_the_page_has_the_recipes_it_describes() -> None:
    assert sorted(units()) == ["proj-scheduler-console.service", "proj-scheduler-dispatch.service"]
    assert sorted(doc["kind"] for doc in manifests()) == ["Deployment", "Job", "PodDisruptionBudget"]


@pytest.mark.parametrize("name", sorted(units()))
def test_a_systemd_unit_passes_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    # where the page says the app is installed, this test's environment stands in
    text = units()[name].replace("/opt/proj/venv", sys.prefix).replace("/opt/proj", str(tmp_path))
    unit = tmp_path / name
    unit.write_text(text)
    verified = subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)
    # verify exits 0 on an unknown key or section, with a warning: any word from it fails
    said = [line for line in (verified.stdout + verified.stderr).splitlines() if line.strip()]
    assert (verified.returncode, said) == (0, []), text


def test_systemd_analyze_catches_what_this_test_relies_on(tmp_path: Path) -> None:
    """The check above can fail: a mistyped key and a missing program are both reported."""
    body = units()["proj-scheduler-dispatch.service"]
    mistyped = body.replace("TimeoutStopSec", "TimeoutStopSecs").replace("/opt/proj/venv", sys.prefix)
    missing = body.replace("/opt/proj/venv", str(tmp_path / "nowhere"))
    for broken in (mistyped, missing):
        unit = tmp_path / "broken.service"
        unit.write_text(broken.replace("/opt/proj", str(tmp_path)))
        verified = subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True,
                                  text=True, timeout=60, cwd=tmp_path)
        assert verified.returncode != 0 or verified.stderr.strip(), broken


@pytest.mark.parametrize("version", KUBERNETES)
def test_the_manifests_pass_kubernetes_schemas(version: str) -> None:
    for doc in manifests():
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_catches_a_misplaced_field() -> None:
    [deployment] = by_kind("Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["timeout"] = 20
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES[-1], strict=True)


def test_the_recipes_agree_on_the_dispatchers_timings() -> None:
    dispatch = units()["proj-scheduler-dispatch.service"]
    stop = int(re.search(r"^TimeoutStopSec=(\d+)$", dispatch, re.M).group(1))
    [deployment] = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    grace = pod["terminationGracePeriodSeconds"]
    assert stop == grace >= 2 * HAND_OVER_BOUND_SECONDS
    assert "--check" in container["readinessProbe"]["exec"]["command"]
    assert container["readinessProbe"]["timeoutSeconds"] > CHECK_BOUND_SECONDS
    assert "livenessProbe" in container and "exec" not in container["livenessProbe"]
    assert "cpu" not in container["resources"]["limits"]  # a CPU limit only makes tasks late
    metrics = re.search(r"--metrics-port (\d+)", dispatch).group(1)
    assert container["ports"][0]["containerPort"] == int(metrics)
    page = " ".join(DOC.read_text().split())
    assert f"unless it exits within {HAND_OVER_BOUND_SECONDS} s" in page
    assert f"unless it answers within {CHECK_BOUND_SECONDS} s" in page
    [budget] = by_kind("PodDisruptionBudget")
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert deployment["spec"]["replicas"] >= 2
