# syntax=docker/dockerfile:1
#
# Three images from one build:
#   docker build --target operator  -t cotenant/operator:0.1.0 .
#   docker build --target agent     -t cotenant/agent:0.1.0 .       # GPU agent (CUDA)
#   docker build --target agent-cpu -t cotenant/agent-cpu:0.1.0 .   # CPU-only agent
# The builder is Debian bookworm (glibc 2.36); both runtime bases have that glibc or newer.

ARG RUST_IMAGE=rust:1.95-bookworm
# The GPU agent's base: NVIDIA's CUDA runtime image, which carries the user-space libraries the
# agent loads at run time (NVRTC to compile its kernels, cuBLAS); the driver (libcuda) is mounted
# by the NVIDIA container runtime. CUDA 12.x and 13.x libraries both load (the agent dlopens
# libnvrtc.so.13/.12 and libcublas.so.13/.12); 12.8 runs on drivers from 570 on.
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
COPY . .
# The registry and target caches persist between builds; the binaries are copied out of the target
# cache because cache mounts are not part of the image.
RUN --mount=type=cache,id=cotenant-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=cotenant-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=cotenant-target,target=/src/target,sharing=locked \
    set -eu; \
    mkdir -p /out; \
    cargo build --release --locked --package cotenant-operator --package cotenant-agent; \
    cp target/release/cotenant-operator /out/; \
    cp target/release/cotenant-agent /out/cotenant-agent-cpu; \
    cargo build --release --locked --package cotenant-agent --features cotenant-agent/cuda; \
    cp target/release/cotenant-agent /out/cotenant-agent-cuda

# The operator: glibc-linked, no shell, runs as nonroot (65532) and needs no writable filesystem.
FROM gcr.io/distroless/cc-debian12:nonroot AS operator
LABEL org.opencontainers.image.title="cotenant-operator" \
      org.opencontainers.image.description="Places ModelTenants on GPU agents and keeps them within their latency SLO" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/cotenant-operator /usr/local/bin/cotenant-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/cotenant-operator"]

# The GPU agent: built with the `cuda` feature on the CUDA runtime image. Its GPU pools start it
# with `--device cuda`, so a node without a usable GPU fails the agent loudly (its GpuAgent status
# says why) instead of serving on the CPU. Kernels compile once per device into the PTX cache
# under /tmp (the pod's writable scratch; the root filesystem is read-only).
FROM ${CUDA_RUNTIME_IMAGE} AS agent
RUN set -eu; \
    groupadd --system --gid 65532 nonroot; \
    useradd --system --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home \
        --shell /usr/sbin/nologin nonroot
LABEL org.opencontainers.image.title="cotenant-agent" \
      org.opencontainers.image.description="Serves cotenant tenants on a GPU over the Open Inference Protocol" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/cotenant-agent-cuda /usr/local/bin/cotenant-agent
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    COTENANT_PTX_CACHE=/tmp/cotenant-ptx
USER 65532:65532
WORKDIR /home/nonroot
# 8000: inference (Open Inference Protocol); 8002: admin (/metrics, /report).
EXPOSE 8000 8002
ENTRYPOINT ["/usr/local/bin/cotenant-agent"]

# The CPU-only agent, for clusters without GPUs: no CUDA in the binary or the image.
FROM debian:bookworm-slim AS agent-cpu
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --system --gid 65532 nonroot; \
    useradd --system --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home \
        --shell /usr/sbin/nologin nonroot
LABEL org.opencontainers.image.title="cotenant-agent-cpu" \
      org.opencontainers.image.description="Serves cotenant tenants on the CPU over the Open Inference Protocol" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/cotenant-agent-cpu /usr/local/bin/cotenant-agent
USER 65532:65532
WORKDIR /home/nonroot
EXPOSE 8000 8002
ENTRYPOINT ["/usr/local/bin/cotenant-agent"]
