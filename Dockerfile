# syntax=docker/dockerfile:1
# The opjournal image: opjournal (server and operator commands), opjournal-reconciler (the
# reconcile worker) and opjournal-sandbox (the fake provider, a binary of its own), in a
# distroless image without a shell, running as the non-root user 65532. The Kubernetes
# manifests are in deploy/. The server is built without the `dev` feature: no `opjournal dev`
# or `opjournal demo` (local stands), and no sandbox provider linked into the server.
#
#   docker build -t opjournal:dev .
#   docker run --rm opjournal:dev --help
#
# In the image the server listens on every address, so `serve` refuses to start until
# callers must authenticate: give it tokens (OPJOURNAL_AUTH__TOKENS, see docs/configuration.md) or
# mutual TLS, or, only where something in front authenticates for it (a service mesh),
# OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED=true. The image sets neither.
#
#   docker run --rm -p 50051:50051 \
#     -e OPJOURNAL_AUTH__TOKENS='[{name="me", sha256="<64 hex>", namespaces=["*"], roles=["admin"]}]' \
#     opjournal:dev
#
# Needs BuildKit (Docker 23+, buildx, podman/buildah): cargo's registry and target directory
# live in cache mounts, so a rebuild after a source change compiles only this crate.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS build
WORKDIR /src
# What the build reads: the manifest and lock file, the build script and the protos it
# compiles (protox, no protoc), the migrations embedded by sqlx::migrate!, the review
# console's templates and assets compiled into the binary, and the sources.
# The server's allocator returns freed memory to the system 1 s after it was freed, as in
# .cargo/config.toml (not copied: its other settings are for tests).
ENV JEMALLOC_SYS_WITH_MALLOC_CONF=background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY migrations ./migrations
COPY templates ./templates
COPY assets ./assets
COPY src ./src
COPY crates ./crates
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p opjournal -p opjournal-sandbox --no-default-features --bins \
    && mkdir -p /out \
    && cp target/release/opjournal target/release/opjournal-reconciler \
          target/release/opjournal-sandbox /out/

# Same Debian release as the builder, so the glibc the binaries were linked against is there.
# TLS is rustls (no OpenSSL); the CA certificates come with the image.
FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="opjournal" \
      org.opencontainers.image.description="A gRPC operation journal that makes side-effecting tool calls safe to retry" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ /usr/local/bin/
COPY config/policy.example.yaml /etc/opjournal/policy.example.yaml
# In a container the servers listen on every address (the defaults are 127.0.0.1); the
# manifests set these too. `serve` then needs tokens, mutual TLS or an explicit
# OPJOURNAL_AUTH__INSECURE_ALLOW_UNAUTHENTICATED=true to start (see above).
ENV OPJOURNAL_SERVER__LISTEN=0.0.0.0:50051 \
    OPJOURNAL_RECONCILE__HEALTH_LISTEN=0.0.0.0:50052 \
    OPJOURNAL_SERVER__METRICS_LISTEN=0.0.0.0:9464 \
    OPJOURNAL_RECONCILE__METRICS_LISTEN=0.0.0.0:9465 \
    OPJOURNAL_SANDBOX_LISTEN=0.0.0.0:8081
# gRPC (server), gRPC health (reconcile worker), Prometheus metrics (server, worker), HTTP
# (sandbox).
EXPOSE 50051 50052 9464 9465 8081
USER 65532:65532
# Without a database URL the journal is an embedded file under the working directory: give it
# one the non-root user owns (mount a volume there to keep it). Kubernetes sets a Postgres URL.
WORKDIR /home/nonroot
ENTRYPOINT ["/usr/local/bin/opjournal"]
CMD ["serve"]
