from django.contrib import admin
from django.urls import path

from .urls import urlpatterns as shop

urlpatterns = [path("admin/", admin.site.urls), *shop]
