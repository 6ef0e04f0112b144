from __future__ import annotations

from django.conf import settings
from django.urls import path
from shop import views

urlpatterns = [
    path("orders/", views.place_order),
]

if "django.contrib.admin" in settings.INSTALLED_APPS:
    from django.contrib import admin

    urlpatterns.append(path("admin/", admin.site.urls))
