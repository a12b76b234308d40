"""The integration tier's own precondition: the real services answer."""

import psycopg
from kombu import Connection


def test_postgres_answers(postgres_url):
    with psycopg.connect(postgres_url.replace("postgresql+psycopg", "postgresql")) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_rabbitmq_answers(rabbitmq_url):
    with Connection(rabbitmq_url, connect_timeout=5) as conn:
        conn.ensure_connection(max_retries=1)
        assert conn.connected
