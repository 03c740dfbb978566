""".github/workflows/ci.yml: valid for GitHub Actions, and running what .ci/run runs.

Checked offline: check-jsonschema (pinned) carries the GitHub workflow schema
(`--builtin-schema vendor.github-workflows`). The test job's test step must run
.ci/run itself, and .ci/run must be lint then the README's `make test`, so CI on
GitHub and CI here cannot drift apart.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "ci.yml"
CI_RUN = REPO / ".ci" / "run"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def check_workflow(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def workflow() -> dict:
    return YAML(typ="safe").load(WORKFLOW.read_text(encoding="utf-8"))


def commands(script: str) -> list[str]:
    """The command lines of a shell script: no comments, no blank lines, no `set`/`cd` set-up."""
    lines = [line.strip() for line in script.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]


def test_the_workflow_matches_the_github_actions_schema():
    result = check_workflow(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_refuses_a_broken_workflow(tmp_path):
    """The check above can fail: a job with no `runs-on` is refused."""
    broken = tmp_path / "ci.yml"
    broken.write_text(WORKFLOW.read_text(encoding="utf-8").replace("runs-on: ubuntu-latest", "runs_on: ubuntu-latest"))
    assert check_workflow(broken).returncode != 0


def test_runs_on_push_and_pull_request_on_ubuntu_latest(workflow):
    triggers = workflow["on"]
    assert "push" in triggers and "pull_request" in triggers
    assert workflow["jobs"]["test"]["runs-on"] == "ubuntu-latest"


def test_the_test_step_runs_ci_run_which_is_lint_then_make_test(workflow):
    steps = workflow["jobs"]["test"]["steps"]
    runs = [step for step in steps if "run" in step and ".ci/run" in step["run"]]
    assert len(runs) == 1, "exactly one step runs .ci/run"
    assert runs[0]["run"].strip() == "bash .ci/run"
    # Nothing after it but the log upload: the step's result is the job's.
    after = steps[steps.index(runs[0]) + 1:]
    assert all(step.get("if") == "failure()" for step in after)
    # .ci/run is lint, then the README's test command.
    assert commands(CI_RUN.read_text(encoding="utf-8")) == ["make lint", "make test"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "make test   #" in readme


def test_pip_downloads_and_the_debian_base_image_are_cached(workflow):
    steps = workflow["jobs"]["test"]["steps"]
    python = next(step for step in steps if step.get("uses", "").startswith("actions/setup-python@"))
    assert python["with"]["cache"] == "pip" and python["with"]["python-version"] == "3.11"
    caches = [step for step in steps if step.get("uses", "").startswith("actions/cache@")]
    assert any("build-base.sh" in step["with"]["key"] and "BASE_IMAGE_TAR" in step["with"]["path"] for step in caches)
    loads = [step for step in steps if "docker load" in step.get("run", "")]
    assert loads and "cache-hit == 'true'" in loads[0]["if"]


def test_test_logs_are_uploaded_on_failure(workflow):
    steps = workflow["jobs"]["test"]["steps"]
    test_step = next(step for step in steps if step.get("run", "").strip() == "bash .ci/run")
    assert "--basetemp=" in test_step["env"]["PYTEST_ADDOPTS"]
    uploads = [step for step in steps if step.get("uses", "").startswith("actions/upload-artifact@")]
    assert len(uploads) == 1 and uploads[0]["if"] == "failure()"
    assert "test-logs" in uploads[0]["with"]["path"]


def test_a_scheduled_job_runs_make_chaos_and_uploads_its_table(workflow):
    assert workflow["on"]["schedule"], "no schedule"
    chaos = workflow["jobs"]["chaos"]
    assert "schedule" in chaos["if"]
    runs = [step for step in chaos["steps"] if "make chaos" in step.get("run", "")]
    assert len(runs) == 1 and "tee" in runs[0]["run"] and "pipefail" in runs[0]["run"]
    table = runs[0]["run"].split("tee ", 1)[1].strip().strip('"')
    uploads = [step for step in chaos["steps"] if step.get("uses", "").startswith("actions/upload-artifact@")]
    assert len(uploads) == 1 and uploads[0]["if"] == "always()"
    assert uploads[0]["with"]["path"].replace("${{ runner.temp }}", "$RUNNER_TEMP") == table



def base_images_the_tests_build_on() -> set[str]:
    """The bases build-images.sh starts from by default (what the tests and `make chaos` use)."""
    import re

    script = (REPO / "deploy" / "compose" / "build-images.sh").read_text(encoding="utf-8")
    pattern = r'(?:^|\s)(?:RECONCILE_)?BASE_IMAGE="\$\{(?:RECONCILE_)?BASE_IMAGE:-(snapmesh-[^}]+)\}"'
    found = set(re.findall(pattern, script, re.M))
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from support.helpers_deploy import BASE_IMAGE as tests_base
    finally:
        sys.path.remove(str(REPO / "tests"))
    from snapmesh.chaos.compose import BASE_IMAGE as chaos_base

    return found | {tests_base, chaos_base}


@pytest.mark.parametrize("job", ["test", "chaos"])
def test_the_cache_holds_every_base_image_the_tests_build_on(workflow, job):
    """The workflow once cached snapmesh-base:bookworm while the tests build on
    snapmesh-base-slim:bookworm, so every run debootstrapped it again (as root)."""
    needed = base_images_the_tests_build_on()
    assert needed >= {"snapmesh-base-slim:bookworm", "snapmesh-base:bookworm"}, needed
    steps = workflow["jobs"][job]["steps"]
    build = next(step for step in steps if "build-base.sh" in step.get("run", ""))
    saved = next(line for line in build["run"].splitlines() if line.strip().startswith("docker save"))
    made = next(line for line in build["run"].splitlines() if "build-base.sh" in line)
    for image in needed:
        assert image in made.split(), f"{job}: build-base.sh does not build {image}"
        assert image in saved.split(), f"{job}: {image} is not saved for the cache"
    # Nothing overrides the base the images start from, so the cached ones are used.
    assert not any("BASE_IMAGE=" in step.get("run", "") for step in steps)
