"""The Celery app for workers and dispatchers, as in Flask's docs: ``celery -A make_celery worker``."""

from reminders_app import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
