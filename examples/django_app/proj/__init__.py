# Load the Celery app when Django starts, so @app.task and @scheduled_task use it.
from proj.celery import app as celery_app

__all__ = ("celery_app",)
