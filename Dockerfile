# The sidecar container. Build: docker build -t sidecar .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SIDECAR_LISTEN=0.0.0.0:8443 \
    SIDECAR_POLICIES=/etc/sidecar/policies \
    SIDECAR_LEDGER=sqlite:////var/lib/sidecar/ledger.db

RUN groupadd --system --gid 10001 sidecar \
 && useradd --system --uid 10001 --gid sidecar --home-dir /var/lib/sidecar --create-home sidecar

WORKDIR /app
COPY pyproject.toml README.md ./
COPY sidecar ./sidecar
COPY backing_store ./backing_store
RUN pip install --no-cache-dir .
COPY policies /etc/sidecar/policies

USER 10001:10001
EXPOSE 8443
# /healthz on $SIDECAR_LISTEN's port: HTTPS when tls.certFile/keyFile are set, else HTTP.
HEALTHCHECK --interval=10s --timeout=5s CMD ["python", "-m", "sidecar.edge.tls"]
ENTRYPOINT ["sidecar"]
CMD ["serve"]
