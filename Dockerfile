# One image for every evq process (migrate, worker, ops server, SMTP sink).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE alembic.ini ./
COPY evq ./evq
COPY worker ./worker
COPY adapters ./adapters
COPY migrations ./migrations
COPY ops ./ops
RUN pip install --no-cache-dir . && useradd --system evq
USER evq
ENTRYPOINT ["evq"]
CMD ["--help"]
