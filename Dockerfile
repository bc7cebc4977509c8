# syntax=docker/dockerfile:1
# One image for the webhook server, the watcher and the frozen waiter that the injected
# `initshift-init` container copies into build pods.
#
#   docker build --build-arg IMAGE=registry.example/initshift:0.1.0 -t registry.example/initshift:0.1.0 .
#
# IMAGE must be the tag you push: it becomes INITSHIFT_IMAGE, the image the webhook injects
# as `initshift-init`, so the pods it rewrites pull the very image that serves them.

# --- builder: the same make targets CI runs -------------------------------------------------
# Debian's own python3 (not a python:* image): the Makefile prefers /usr/bin/python3
# because it freezes a smaller waiter, and CI builds it the same way. PyInstaller needs
# the shared libpython (libpython3-dev) and binutils; patchelf comes from `make system-deps`.
FROM debian:bookworm-slim AS builder
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      ca-certificates make python3 python3-venv libpython3-dev binutils \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# waiter: the frozen bundle in dist/waiter (needs root for its Debian build packages);
# wheel: the initshift wheel in dist/wheels.
RUN make waiter wheel

# --- runtime: slim Debian Python, the wheel, the waiter bundle, non-root -----------------
FROM python:3.11-slim-bookworm
ARG IMAGE=ghcr.io/initshift/initshift:0.1.0
ENV INITSHIFT_IMAGE=${IMAGE} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1
COPY --from=builder /src/dist/wheels/ /tmp/wheels/
# The dependencies at the versions CI tested (constraints/image.txt, `make lock`), not
# whatever is newest on the day the image is built.
COPY constraints/image.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels /tmp/constraints.txt
# The bundle's `waiter-init` has its ELF interpreter at this exact path (protocol.IMAGE_WAITER_DIR).
COPY --from=builder /src/dist/waiter/ /opt/initshift/waiter/
# Non-root (protocol.IMAGE_UID); nothing in the image needs to be written at run time,
# so the Deployment runs it with a read-only root filesystem.
USER 65532:65532
# 8443: admission (HTTPS); 8080: /metrics (plain HTTP, INITSHIFT_METRICS_PORT).
EXPOSE 8443 8080
ENTRYPOINT ["initshift"]
CMD ["serve", "--watch"]
