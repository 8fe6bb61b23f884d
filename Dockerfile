# The sidecar container (also holds `backing-store`). Build: docker build -t sidecar .
#
# The base image is pinned by digest (python:3.11-slim): a rebuild gets the same bytes.
# To move to a newer one, look its digest up (`docker buildx imagetools inspect
# python:3.11-slim`), replace it here and rebuild.
FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SIDECAR_LISTEN=0.0.0.0:8443 \
    SIDECAR_POLICIES=/etc/sidecar/policies \
    SIDECAR_LEDGER=sqlite:////var/lib/sidecar/ledger.db

RUN groupadd --system --gid 10001 sidecar \
 && useradd --system --uid 10001 --gid sidecar --home-dir /var/lib/sidecar --create-home sidecar

WORKDIR /app
# 1. The dependencies, in a layer of their own: a change to the code reuses it. Exactly
#    the versions in requirements.lock, each file checked against its sha256
#    (regenerate the lock with deploy/requirements-lock.sh; a test checks it matches
#    pyproject.toml).
COPY requirements.lock ./
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock
# 2. The code, built with the setuptools from the lock; nothing else is fetched.
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
COPY backing_store ./backing_store
RUN pip install --no-cache-dir --no-deps --no-build-isolation --no-index . \
 && pip check
COPY policies /etc/sidecar/policies

USER 10001:10001
EXPOSE 8443
# /healthz on $SIDECAR_LISTEN's port: HTTPS when tls.certFile/keyFile are set, else HTTP.
HEALTHCHECK --interval=10s --timeout=5s CMD ["python", "-m", "sidecar.edge.tls"]
ENTRYPOINT ["sidecar"]
CMD ["serve"]
