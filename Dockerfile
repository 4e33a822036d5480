# syntax=docker/dockerfile:1
# One image for every tock process; the command picks the type:
#   docker run IMAGE timer | consumer --tasks myapp.tasks | dashboard | migrate
# Your task modules go on top: see README, "Run on ECS" (FROM this image + COPY).

# ---- build: a virtualenv with tock and its runtime dependencies only
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/tock
COPY requirements-dev.lock pyproject.toml README.md ./
COPY shared/ shared/
COPY timer_service/ timer_service/
COPY consumer/ consumer/
COPY dashboard/ dashboard/
COPY cli/ cli/
COPY devstack/ devstack/
COPY demo/ demo/
# The lock is used as constraints: runtime packages at the versions the suite ran with,
# none of the dev tools. All dependencies ship wheels, so no compiler is needed.
RUN /opt/tock/bin/pip install --constraint requirements-dev.lock .

# ---- runtime: slim base, the venv, no build tools, non-root
FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="tock" \
      org.opencontainers.image.description="Distributed job scheduler: Postgres + Amazon SQS" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/tock/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONPATH=/app \
    TOCK_LOG_FORMAT=json \
    TOCK_HEALTH_PORT=9000 \
    TOCK_DASHBOARD_HOST=0.0.0.0 \
    TOCK_DASHBOARD_PORT=8080
RUN groupadd --system --gid 10001 tock \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin tock
# Owned by root and read-only to the tock user: the process cannot change its own code.
COPY --from=build /opt/tock /opt/tock
COPY --chmod=0555 infra/docker/entrypoint.sh /usr/local/bin/tock-entrypoint
COPY --chmod=0444 infra/docker/healthcheck.py /opt/tock/healthcheck.py
WORKDIR /app
USER 10001:10001
# 8080: dashboard; 9000: /healthz, /readyz, /metrics of the timer and consumers.
EXPOSE 8080 9000
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "/opt/tock/healthcheck.py"]
# Exec form: the entrypoint execs Python, which then gets SIGTERM itself.
ENTRYPOINT ["/usr/local/bin/tock-entrypoint"]
CMD ["--help"]
