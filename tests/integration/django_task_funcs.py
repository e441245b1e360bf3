"""Django Tasks framework functions for test_django_tasks (imported only where django.tasks exists)."""

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def add(a, b):
    return a + b


@task
def explode():
    raise ValueError("boom")


@task(takes_context=True)
def which_attempt(context):
    return context.attempt
