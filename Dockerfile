# syntax=docker/dockerfile:1
#
# Two images from one build:
#   docker build --target operator -t cotenant/operator:0.1.0 .
#   docker build --target agent    -t cotenant/agent:0.1.0 .
# The builder is Debian bookworm, like both runtime bases, so the binaries' glibc matches.

ARG RUST_IMAGE=rust:1.95-bookworm

FROM ${RUST_IMAGE} AS builder
# Cargo features of the agent, e.g. "cuda" (passed as cotenant-agent/<feature>); empty for none.
ARG AGENT_FEATURES=""
WORKDIR /src
COPY . .
# The registry and target caches persist between builds; the binaries are copied out of the target
# cache because cache mounts are not part of the image.
RUN --mount=type=cache,id=cotenant-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=cotenant-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=cotenant-target,target=/src/target,sharing=locked \
    set -eu; \
    features=""; \
    for f in ${AGENT_FEATURES}; do features="${features:+$features,}cotenant-agent/$f"; done; \
    cargo build --release --locked \
        --package cotenant-operator --package cotenant-agent \
        ${features:+--features "$features"}; \
    mkdir -p /out; \
    cp target/release/cotenant-operator target/release/cotenant-agent /out/

# The operator: glibc-linked, no shell, runs as nonroot (65532) and needs no writable filesystem.
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
LABEL org.opencontainers.image.title="cotenant-operator" \
      org.opencontainers.image.description="Places ModelTenants on GPU agents and keeps them within their latency SLO" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/cotenant-operator /usr/local/bin/cotenant-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/cotenant-operator"]

# The agent: glibc, so it can dlopen libcuda (mounted by the NVIDIA container runtime, which the
# NVIDIA_* variables ask for) at run time; the image itself carries no CUDA libraries.
FROM debian:bookworm-slim AS agent
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --system --gid 65532 nonroot; \
    useradd --system --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home \
        --shell /usr/sbin/nologin nonroot
LABEL org.opencontainers.image.title="cotenant-agent" \
      org.opencontainers.image.description="Serves cotenant tenants on a GPU over the Open Inference Protocol" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/cotenant-agent /usr/local/bin/cotenant-agent
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
WORKDIR /home/nonroot
# 8000: inference (Open Inference Protocol); 8002: admin (/metrics, /report).
EXPOSE 8000 8002
ENTRYPOINT ["/usr/local/bin/cotenant-agent"]
