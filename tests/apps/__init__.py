"""Celery applications that the tests run in real worker subprocesses."""
