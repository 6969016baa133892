from django.urls import path
from shop import views

urlpatterns = [
    path("orders", views.place_order),
    path("orders/<int:order_id>", views.get_order),
]
