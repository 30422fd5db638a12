# One image for the API, the Celery worker and beat (docker-compose.yml picks the command).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends ethtool snmp && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml requirements.lock README.md alembic.ini ./
COPY service service
COPY collectors collectors
COPY simulator simulator
COPY migrations migrations
# the locked versions of what fabricwatch needs (requirements.lock also pins the dev extra, not installed here)
RUN pip install --no-cache-dir -c requirements.lock .
RUN useradd --system --uid 10001 fabricwatch \
    && install -d -o fabricwatch -m 0700 /var/lib/fabricwatch/spool  # a named volume there keeps its owner
USER fabricwatch
EXPOSE 8080
CMD ["fabricwatch", "serve", "--host", "0.0.0.0"]
