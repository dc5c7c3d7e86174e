from tests.integration.dispatch_fixtures import schedule, scheduler  # noqa: F401
