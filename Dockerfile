# One image for every evq process (migrate, worker, ops server, SMTP sink).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY worker ./worker
COPY adapters ./adapters
COPY migrations ./migrations
COPY ops ./ops
# ops/cli/schemas is a link to docs/cli-schema (the output schemas `evq schema` serves).
COPY docs/cli-schema ./docs/cli-schema
RUN pip install --no-cache-dir . && useradd --system evq
USER evq
ENTRYPOINT ["evq"]
CMD ["--help"]
