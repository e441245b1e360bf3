"""The broker paths: how a claimed run becomes a Celery message.

``publish`` (the row type's messages; the generic path through kombu and the Redis fast path),
``amqp`` (RabbitMQ with publisher confirms), ``dlq`` (the dead-letter announcement).
"""
