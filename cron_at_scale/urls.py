"""``path("", include("cron_at_scale.urls"))`` serves ``/metrics`` (Prometheus). The dashboard
lives in the admin (Jobs → Dashboard), under the admin's own login."""

from django.urls import path

from cron_at_scale import views

app_name = "cron_at_scale"
urlpatterns = [path("metrics", views.metrics, name="metrics")]
