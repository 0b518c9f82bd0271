# One image for every pressrun service; docker-compose.yml picks the command.
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends libssl3 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/pressrun
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir .
ENTRYPOINT ["pressrun"]
