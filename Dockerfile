# syntax=docker/dockerfile:1
# The capalarm image: a build stage compiles the package with its C parts (the kernel scanner,
# alarm/collectors/kernel/_fastscan.c, the detector's loops and whole tick, alarm/detector/
# _fused.c and _whole_tick.c, the reader of write-event lines, alarm/_eventscan.c, and the
# /metrics series writer, exporters/_textformat.c), the runtime stage is slim and runs as a
# non-root user.
#
#   docker build -t capalarm:0.1.0 .
#
# This recipe cannot be built on the project's development machines (no container engine);
# tests/test_helm.py and tests/test_packaging.py check what can be checked without one: the
# ENTRYPOINT and CMD, user and port agree with the Helm chart and the package's console script.  See docs/deployment.md.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY alarm ./alarm
COPY exporters ./exporters
# The deployment files the package carries (alarm/deploy_files/, `capalarm deploy-files DIR`).
COPY deploy ./deploy
COPY dashboards ./dashboards
# setup.py marks the extensions optional (a host without a compiler still installs); here the
# compiler is present, so a missing one is a broken build: check that each imports.
RUN python -m venv /opt/capalarm \
 && /opt/capalarm/bin/pip install --no-cache-dir . \
 && /opt/capalarm/bin/python -c \
      "import alarm.collectors.kernel._fastscan, alarm.detector._fused, alarm._eventscan, exporters._textformat"

FROM ${PYTHON_IMAGE}
# journalctl: `type: auto` sources read the host journal where /dev/kmsg cannot be opened
# (an unprivileged pod), and `type: journald` always does.
RUN apt-get update \
 && apt-get install -y --no-install-recommends systemd \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 capalarm \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/capalarm --no-create-home \
      --shell /usr/sbin/nologin capalarm \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/capalarm \
 && install -d -m 0755 /etc/capalarm
COPY --from=build /opt/capalarm /opt/capalarm
ENV PATH=/opt/capalarm/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The node-local DaemonSet overrides the user with 0 (root without capabilities, to read the
# host's root-owned journal); the cluster Deployment keeps this one.
USER 10001:10001
VOLUME ["/var/lib/capalarm"]
EXPOSE 9733
# The program is the entrypoint and the verb the default command, so that any verb runs:
#   docker run IMAGE                                  (the service, on the mounted config)
#   docker run -v $PWD:/c IMAGE check-config /c/config.yaml
#   docker run IMAGE --version
ENTRYPOINT ["capalarm"]
CMD ["run", "--config", "/etc/capalarm/config.yaml"]
