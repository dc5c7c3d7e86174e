"""Batch jobs on Apache Spark (PySpark): bulk scheduling from DataFrames.

::

    from celery_scheduler.spark import schedule_dataframe, session

    spark = session()                      # local; session("spark://host:7077") for a cluster
    df = spark.read.parquet("reminders.parquet")
    result = schedule_dataframe(df, send_reminder, at="remind_at",
                                args=["customer_id"], kwargs={"step": "step"})
    result.accepted, result.rejected_count
    result.rejected.show()                 # each refused row, with the error's type and message

    found = audit(spark, get_settings(app))  # accepted keys the store cannot account for
    found.missing.show()

    made = report(spark, get_settings(app), "report/")  # tables, and report/report.html

Needs the ``spark`` extra (PySpark 3.5) and Java 17. The Kafka connector comes from Maven
Central through Spark's own ``spark.jars.packages``, cached outside the checkout.
"""

from __future__ import annotations

from celery_scheduler.spark.audit import AuditResult, audit
from celery_scheduler.spark.bulk import BulkResult, schedule_dataframe
from celery_scheduler.spark.report import Report, report
from celery_scheduler.spark.session import session

__all__ = ["AuditResult", "BulkResult", "Report", "audit", "report", "schedule_dataframe",
           "session"]
