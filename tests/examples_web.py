"""The web examples (examples/django_app, examples/flask_app) loaded into the test process.

Django reads its settings once per process, so the Django project is set up once, on a
SQLite file of the session's; Flask apps are made per test with ``create_app``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.services import REPO

DJANGO_DIR = REPO / "examples" / "django_app"
FLASK_DIR = REPO / "examples" / "flask_app"


def importable(directory: Path) -> None:
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


def django_project(database: Path) -> ModuleType:
    """Set up the Django example on *database* (first call wins); return its Celery module."""
    importable(DJANGO_DIR)
    from django.conf import settings

    if not settings.configured:
        # Only while the project loads: a DJANGO_SETTINGS_MODULE left in the environment
        # would make every later Celery app (and every worker the suite starts) load Django.
        previous = os.environ.get("DJANGO_SETTINGS_MODULE")
        os.environ["DJANGO_SETTINGS_MODULE"] = "proj.settings"
        try:
            import django
            from django.core.management import call_command

            settings.DATABASES["default"]["NAME"] = str(database)
            django.setup()
            import proj.celery  # the app, as a Django process loads it

            call_command("migrate", verbosity=0)
        finally:
            if previous is None:
                os.environ.pop("DJANGO_SETTINGS_MODULE", None)
            else:
                os.environ["DJANGO_SETTINGS_MODULE"] = previous
    import proj.celery

    return proj.celery


def django_database() -> str:
    from django.conf import settings

    return str(settings.DATABASES["default"]["NAME"])


def flask_app(database: Path, **celery: Any) -> Any:
    """A Flask app of the example on *database*, its tables created; *celery* overrides settings."""
    importable(FLASK_DIR)
    from reminders_app import CELERY_DEFAULTS, create_app

    app = create_app({"DATABASE": str(database), "CELERY": {**CELERY_DEFAULTS, **celery}})
    result = app.test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0, (result.output, result.exception)
    return app
