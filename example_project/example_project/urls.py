from django.contrib import admin
from django.urls import path

from cron_at_scale import views as cron_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", cron_views.metrics, name="metrics"),  # Prometheus; keep it off the public internet
]
