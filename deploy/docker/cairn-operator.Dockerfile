# The operator image: docker build -f deploy/docker/cairn-operator.Dockerfile -t ghcr.io/cairn-db/cairn-operator:0.1.0 .
FROM rust:1.95-bookworm AS build
# The workspace's RocksDB bindings need libclang even though the operator does not link them.
RUN apt-get update && apt-get install -y --no-install-recommends clang libclang-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p cairn-operator && cp target/release/cairn-operator /cairn-operator

FROM debian:bookworm-slim
RUN groupadd --gid 10001 cairn && useradd --uid 10001 --gid cairn --no-create-home cairn
COPY --from=build /cairn-operator /usr/local/bin/cairn-operator
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/cairn-operator"]
CMD ["run"]
