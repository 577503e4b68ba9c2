# edgeinfer's container image: a wheel built and installed into a virtual environment in a Debian stage,
# which is then copied onto a distroless Python runtime (no shell, no package manager, no compilers).
#
#   docker build -t edgeinfer .                                   CPU (onnxruntime)
#   docker build -t edgeinfer:s3 --build-arg EXTRAS=s3 .          + models on S3 (s3fs, botocore)
#   docker build -t edgeinfer:otel --build-arg EXTRAS=otel .      + OpenTelemetry traces (docs/observability.md)
#   docker build -t edgeinfer:gpu -f Dockerfile.gpu .             CUDA (onnxruntime-gpu)
#   docker run -p 8080-8082:8080-8082 -v "$PWD/examples/model_repository:/models:ro" edgeinfer
#
# Models are read from /models and the configuration from /etc/edgeinfer/config.yaml (mount your own over
# either). The two images must carry the same Python (Debian 12's 3.11 at /usr/bin/python3): the virtual
# environment made in the first runs on the interpreter of the second.
ARG BUILD_IMAGE=debian:bookworm-slim
ARG RUNTIME_IMAGE=gcr.io/distroless/python3-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
ARG EXTRAS=""
# Debian's current versions are the ones wanted; this stage is thrown away (binutils: strip; gcc: the
# C part of the wheel and, with python3-dev's headers, the request path compiled by mypyc: setup.py).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev binutils ca-certificates gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
COPY deploy/container/slim-venv.sh /usr/local/bin/
# The wheel, then the runtime environment from it, then slimmed (see slim-venv.sh).
RUN python3 -m venv /opt/edgeinfer \
    && /opt/edgeinfer/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && wheel="$(ls /wheels/edgeinfer-*.whl)" \
    && /opt/edgeinfer/bin/pip install --no-cache-dir "edgeinfer${EXTRAS:+[$EXTRAS]} @ file://${wheel}" \
    && slim-venv.sh /opt/edgeinfer

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="edgeinfer" \
      org.opencontainers.image.description="A small, fast Open Inference Protocol (KServe V2) server" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/edgeinfer /opt/edgeinfer
COPY deploy/container/config.yaml /etc/edgeinfer/config.yaml
ENV PATH=/opt/edgeinfer/bin:/usr/bin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
# A fixed numeric user (distroless' "nonroot"), so that Kubernetes' runAsNonRoot can check it.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 8081 8082
# No shell or curl in the image: the probe is a few lines of the Python already there (about 40 ms).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:8080/v2/health/ready', timeout=2).status != 200)"]
ENTRYPOINT ["edgeinfer", "serve"]
CMD ["--config", "/etc/edgeinfer/config.yaml"]
