# The `cairn` node image: docker build -f deploy/docker/cairn.Dockerfile -t ghcr.io/cairn-db/cairn:0.1.0 .
# Built on Debian bookworm and run on bookworm-slim, so the binary finds the glibc and
# libstdc++ it was linked against (RocksDB is C++).
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends clang libclang-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin cairn && cp target/release/cairn /cairn

FROM debian:bookworm-slim
# The uid the operator's pod security context runs as (crates/cairn-operator/src/build.rs).
RUN groupadd --gid 10001 cairn && useradd --uid 10001 --gid cairn --no-create-home cairn \
    && mkdir -p /var/lib/cairn && chown cairn:cairn /var/lib/cairn
COPY --from=build /cairn /usr/local/bin/cairn
USER 10001:10001
# Client gRPC, peer gRPC, HTTP (metrics and probes).
EXPOSE 5005 5006 9464
VOLUME /var/lib/cairn
ENTRYPOINT ["/usr/local/bin/cairn"]
# Reachable from outside the container, so the first start needs CAIRN_ADMIN_PASSWORD.
CMD ["serve", "--data-dir", "/var/lib/cairn/data", "--listen", "0.0.0.0:5005", "--http-listen", "0.0.0.0:9464"]
