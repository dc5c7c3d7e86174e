"""`scripts/debian-install`: one Debian install at a time, nothing installed twice.

dpkg allows one install at a time. `scripts/test` once installed Chromium while
`scripts/services up`, started in the background, installed RabbitMQ: on a machine that had
neither, the second apt-get failed on dpkg's lock. Here apt-get is replaced by a stand-in
that behaves as dpkg does (a second copy fails at once unless told to wait for the lock with
`-o DPkg::Lock::Timeout=N`), on a PATH where the packages are missing until the stand-in
"installs" them. A copy of the script with its serialisation taken out must fail the same
test, so the test can fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "debian-install"

# The programs the script and the stand-ins run, linked into the test's PATH: nothing else
# of the machine's is on it, so a package this machine has is still missing in the test.
TOOLS = ("bash", "env", "flock", "mkdir", "rmdir", "dirname", "sort", "id", "mktemp", "grep",
         "tail", "rm", "sleep", "cat", "chmod", "touch", "date")

# apt-get as dpkg makes it behave: it holds the lock while it works (a second), and a second
# copy either waits for the lock (DPkg::Lock::Timeout) or fails as dpkg does.
APT_GET = r"""#!/usr/bin/env bash
state=$STANDIN_STATE
timeout=0
for arg; do case $arg in DPkg::Lock::Timeout=*) timeout=${arg#*=} ;; esac; done
waited=0
until mkdir "$state/dpkg-lock" 2>/dev/null; do
    if (( waited >= timeout * 10 )); then
        holder=$(cat "$state/holder" 2>/dev/null)
        echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process $holder" >&2
        exit 100
    fi
    sleep 0.1
    waited=$((waited + 1))
done
echo $$ > "$state/holder"
trap 'rm -f "$state/holder"; rmdir "$state/dpkg-lock"' EXIT
sleep 1
args=()
for arg; do [[ $arg == -* || $arg == *=* ]] || args+=("$arg"); done
echo "${args[*]}" >> "$state/calls"
[[ ${args[0]} == install ]] || exit 0
for package in "${args[@]:1}"; do
    if [[ " $STANDIN_UNAVAILABLE " == *" $package "* ]]; then
        echo "E: Unable to locate package $package" >&2
        exit 100
    fi
done
for package in "${args[@]:1}"; do
    printf '#!/usr/bin/env bash\n' > "$STANDIN_BIN/$package"
    chmod +x "$STANDIN_BIN/$package"
done
"""

# apt-cache policy: a candidate for every package but the unavailable ones
APT_CACHE = r"""#!/usr/bin/env bash
package=${@: -1}
[[ " $STANDIN_UNAVAILABLE " == *" $package "* ]] && exit 0
printf '%s:\n  Installed: (none)\n  Candidate: 1.0-1\n' "$package"
"""

# for a run that is not root: sudo that just runs the command
SUDO = '#!/usr/bin/env bash\nexec "$@"\n'


@dataclass
class Machine:
    """A PATH with stand-ins for apt-get, apt-cache and sudo, and what they recorded."""

    bin: Path
    state: Path
    env: dict[str, str]

    def run(self, script: Path = SCRIPT, *packages: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["bash", str(script), *packages], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def calls(self) -> list[str]:
        path = self.state / "calls"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is needed by scripts/debian-install"
        (bin_dir / tool).symlink_to(found)
    for name, text in (("apt-get", APT_GET), ("apt-cache", APT_CACHE), ("sudo", SUDO)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "STANDIN_STATE": str(state),
        "STANDIN_BIN": str(bin_dir),
        "STANDIN_UNAVAILABLE": "",
        "CELERY_SCHEDULER_DEBIAN_LOCK": str(tmp_path / "install.lock"),
        "CELERY_SCHEDULER_DEBIAN_WAIT": "60",
    }
    return Machine(bin_dir, state, env)


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=60)
    return process.returncode, stderr


def without_serialisation(tmp_path: Path) -> Path:
    """The script as it was before: no shared lock, and apt-get not told to wait for dpkg's."""
    text = SCRIPT.read_text()
    broken = re.sub(r"take_lock\(\) \{\n", "take_lock() {\n    return 0\n", text)
    broken = broken.replace('APT_WAIT=(-o "DPkg::Lock::Timeout=$WAIT")', "APT_WAIT=()")
    assert broken.count("return 0\n") > text.count("return 0\n") and "APT_WAIT=()" in broken
    path = tmp_path / "debian-install-unserialised"
    path.write_text(broken)
    return path


def test_two_installs_at_once_both_succeed_and_install_once(machine: Machine) -> None:
    # given a machine without Redis and Chromium, when two callers install them at once
    first = machine.run(SCRIPT, "redis-server", "chromium")
    second = machine.run(SCRIPT, "chromium", "redis-server")
    results = [finish(first), finish(second)]

    # then both succeed, and the packages were installed by one apt-get install
    assert [rc for rc, _ in results] == [0, 0], results
    installs = [sorted(call.split()[1:]) for call in machine.calls() if call.startswith("install")]
    assert installs == [["chromium", "redis-server"]], machine.calls()
    said = "".join(err for _, err in results)
    assert "installed by another run meanwhile" in said
    assert re.search(r"installed (redis-server chromium|chromium redis-server) in \d+s", said)


def test_without_serialisation_the_second_install_fails(machine: Machine, tmp_path: Path) -> None:
    broken = without_serialisation(tmp_path)
    first = machine.run(broken, "redis-server")
    second = machine.run(broken, "chromium")
    results = [finish(first), finish(second)]

    assert sorted(rc for rc, _ in results) == [0, 1], results
    assert "Could not get lock /var/lib/dpkg/lock-frontend" in "".join(e for _, e in results)


def test_apt_get_waits_for_a_dpkg_lock_held_by_someone_else(machine: Machine) -> None:
    # an install this project did not start (unattended upgrades, an operator) holds dpkg
    other = subprocess.Popen(["bash", str(machine.bin / "apt-get"), "install", "curl"],
                             env=machine.env)
    try:
        rc, stderr = finish(machine.run(SCRIPT, "redis-server"))
    finally:
        other.wait(timeout=30)
    assert rc == 0, stderr
    assert (machine.bin / "redis-server").exists()


def test_a_second_run_installs_nothing(machine: Machine) -> None:
    assert finish(machine.run(SCRIPT, "redis-server"))[0] == 0
    calls = machine.calls()

    rc, stderr = finish(machine.run(SCRIPT, "redis-server"))

    assert rc == 0 and stderr == ""
    assert machine.calls() == calls


def test_a_package_debian_cannot_supply_is_named(machine: Machine) -> None:
    machine.env["STANDIN_UNAVAILABLE"] = "chromium"

    rc, stderr = finish(machine.run(SCRIPT, "redis-server", "chromium"))

    assert rc == 1
    assert "Debian has no package 'chromium'" in stderr
    assert "browser" in stderr  # who needs it


def test_an_unknown_package_is_refused_before_anything_runs(machine: Machine) -> None:
    rc, stderr = finish(machine.run(SCRIPT, "redis-server", "redis"))

    assert rc == 1
    assert "unknown package 'redis'" in stderr
    assert machine.calls() == []


def test_without_root_or_sudo_it_says_what_to_install(machine: Machine) -> None:
    (machine.bin / "sudo").unlink()
    (machine.bin / "id").unlink()
    (machine.bin / "id").write_text("#!/usr/bin/env bash\necho 1000\n")
    (machine.bin / "id").chmod(0o755)

    rc, stderr = finish(machine.run(SCRIPT, "chromium"))

    assert rc == 1
    assert "apt-get install chromium" in stderr
    assert machine.calls() == []


# --- the list of packages -------------------------------------------------------------

def listed_packages() -> set[str]:
    out = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def script_files() -> list[Path]:
    """The project's scripts (what is checked in under scripts/, not caches beside them)."""
    return [p for p in (ROOT / "scripts").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts]


def test_only_debian_install_runs_apt_get() -> None:
    scripts = [p for p in script_files() if p != SCRIPT]
    scripts += [ROOT / "tox.ini", ROOT / ".ci" / "run"]
    offenders = [str(p.relative_to(ROOT)) for p in scripts
                 if re.search(r"apt-get\s+(-\S+\s+)*(install|update)\b", p.read_text())]
    assert offenders == []


def test_the_scripts_install_what_readme_names() -> None:
    services = subprocess.run(
        [str(ROOT / "scripts" / "services"), "packages", "kafka", "cassandra", "redis",
         "rabbitmq", "postgres"], capture_output=True, text=True, check=True).stdout.split()
    asked = set(services)
    for path in (p for p in script_files() if p != SCRIPT):
        for line in path.read_text().splitlines():
            line = re.sub(r"\$\([^)]*\)", "", line)  # what `scripts/services packages` says
            if line.lstrip().startswith("#"):
                continue
            if match := re.search(r"debian-install\"?((?:\s+[a-z0-9][a-z0-9.+-]*)+)", line):
                asked.update(match.group(1).split())
    readme = (ROOT / "README.md").read_text()
    section = readme.split("Debian packages the scripts install", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`([a-z0-9.+-]+)`", section))

    assert asked == listed_packages()
    assert named == listed_packages()


def test_scripts_test_installs_before_starting_services_in_the_background() -> None:
    text = (ROOT / "scripts" / "test").read_text()
    install = text.index("scripts/debian-install $(scripts/services packages) chromium systemd")
    background = text.index("scripts/services up >")
    assert install < background
    assert re.search(r"scripts/services up [^\n]*&\n", text[background:])
    assert os.access(SCRIPT, os.X_OK)
