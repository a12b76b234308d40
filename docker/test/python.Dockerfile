# Python 3.11 (Debian bookworm's) on the debootstrapped base, for docker/Dockerfile's
# PYTHON_IMAGE build arg: python-is-python3 because that file runs `python -m venv`; the host's
# locally added CA certificates; the host's torch CPU wheel, found through an image-wide pip.conf.
ARG BASE=local/bookworm:base
FROM ${BASE}
ENV LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive
COPY certs/ /usr/local/share/ca-certificates/
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python-is-python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY wheels/ /opt/wheels/
RUN printf '[global]\nfind-links = /opt/wheels\n' > /etc/pip.conf
