"""The Django and Flask guides are projects: each file they show is written out, and the
project's own tests run (with the testing helper: no services), so the guides cannot rot.

A file is a ``python`` code block right after a line that names it: **`path/to/file.py`**.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.services import REPO

FILE = re.compile(r"^\*\*`([^`]+)`\*\*\n\n```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def project_files(page: Path) -> dict[str, str]:
    """The files *page* shows, by path."""
    files: dict[str, str] = {}
    for match in FILE.finditer(page.read_text()):
        path, text = match.groups()
        assert path not in files, f"{page.name} shows {path} twice"
        files[path] = text
    return files


def write_project(files: dict[str, str], root: Path) -> None:
    """Write *files* under *root*, with the empty ``__init__.py`` of each package the page
    leaves out (``startapp`` makes them)."""
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for folder in {(root / path).parent for path in files}:
        while folder != root:
            (folder / "__init__.py").touch(exist_ok=True)
            folder = folder.parent


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # the package from this checkout, whatever an environment has installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(REPO)])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_django_guide_is_a_project_whose_tests_pass(tmp_path: Path) -> None:
    files = project_files(REPO / "docs" / "django.md")
    assert {"proj/settings.py", "proj/celery.py", "reminders/models.py", "reminders/tasks.py",
            "reminders/views.py", "reminders/tests.py", "manage.py"} <= set(files)
    write_project(files, tmp_path)

    check = run(["manage.py", "check"], tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = run(["manage.py", "test", "--verbosity", "2", "reminders"], tmp_path)
    output = tests.stdout + tests.stderr
    assert tests.returncode == 0, output
    ran = re.search(r"^Ran (\d+) tests?", output, re.MULTILINE)
    assert ran and int(ran.group(1)) == files["reminders/tests.py"].count("    def test_"), output


def test_the_flask_guide_is_an_application_whose_tests_pass(tmp_path: Path) -> None:
    files = project_files(REPO / "docs" / "flask.md")
    assert {"reminders_app/__init__.py", "reminders_app/tasks.py", "reminders_app/views.py",
            "make_celery.py", "tests/conftest.py", "tests/test_reminders.py"} <= set(files)
    write_project(files, tmp_path)

    loads = run(["-c", "import make_celery; print(make_celery.celery_app.main)"], tmp_path)
    assert loads.returncode == 0 and loads.stdout.strip() == "reminders_app", loads.stderr
    tests = run(["-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"], tmp_path)
    output = tests.stdout + tests.stderr
    assert tests.returncode == 0, output
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) == files["tests/test_reminders.py"].count("\ndef test_"), output
