"""Settings for docs screenshots ONLY (bench/screenshots.py): the example project's, plus a
middleware that logs every request from localhost in as the superuser ``bench``. Never use in
production: it is an open door."""

from example_project.settings import *  # noqa: F403

DEBUG = True  # runserver serves the admin's static files
MIDDLEWARE = [*MIDDLEWARE, "screenshot_settings.AutoLogin"]  # noqa: F405


class AutoLogin:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.contrib.auth import login
        from django.contrib.auth.models import User

        if not request.user.is_authenticated and request.META.get("REMOTE_ADDR") == "127.0.0.1":
            user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
                "bench", "b@example.com", None)
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return self.get_response(request)
