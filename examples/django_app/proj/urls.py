from django.urls import path
from reminders import views

urlpatterns = [
    path("reminders/", views.create_reminder, name="create-reminder"),
    path("reminders/<int:reminder_id>/", views.reminder_status, name="reminder-status"),
]
