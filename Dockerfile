# syntax=docker/dockerfile:1
#
# Tenure's server image: the static tenure binary on distroless, run as a
# user without privileges (65532, "nonroot"), its data in the volume /data.
#
#   docker build -t tenure .
#
# It needs BuildKit (docker build's builder since Docker 23; buildx), for
# the cache mounts and the cross-compiling build stage.
#
# `tenure version` in the image reports the commit only if told it, since
# .git stays out of the build context (.dockerignore):
#
#   docker build -t tenure \
#     --build-arg TENURE_VERSION="$(git describe --tags --always --dirty)" \
#     --build-arg TENURE_COMMIT="$(git rev-parse HEAD)" \
#     --build-arg TENURE_COMMIT_TIME="$(git log -1 --format=%cI)" .
#
# For other platforms: docker buildx build --platform linux/arm64 ...
# (the build stage cross-compiles; nothing runs under emulation).
#
# CI has no docker; it runs scripts/build.sh, the build below, for
# linux/arm64 and darwin/arm64 (scripts/test.sh), and TestDockerfile in
# internal/cli checks this file's shape and the flags of its command.
# docs/operations.md, "Install and run", shows how to run the image.

# The Go release CI builds with (go.mod: go 1.26). For a reproducible
# image also pin its digest: FROM golang:1.26.8@sha256:... (docker
# buildx imagetools inspect golang:1.26.8 prints it).
FROM --platform=$BUILDPLATFORM golang:1.26.8 AS build
WORKDIR /src
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG TENURE_VERSION
ARG TENURE_COMMIT
ARG TENURE_COMMIT_TIME
# scripts/build.sh: CGO_ENABLED=0, -trimpath, -ldflags "-s -w".
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    GOOS="$TARGETOS" GOARCH="$TARGETARCH" \
    TENURE_VERSION="$TENURE_VERSION" TENURE_COMMIT="$TENURE_COMMIT" TENURE_COMMIT_TIME="$TENURE_COMMIT_TIME" \
    ./scripts/build.sh /out/bin/tenure \
 && mkdir -p /out/data

# static-debian12: CA certificates, tzdata and /etc/passwd, and no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/bin/tenure /usr/local/bin/tenure
# /data, empty and owned by the user, so that a new volume is writable
# (a directory COPY creates takes the --chown owner).
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
VOLUME /data
# 7480: the API, web page, /metrics, /healthz, /readyz. 7481: raft.
EXPOSE 7480 7481
ENTRYPOINT ["tenure"]
# A node on every interface, keeping its data in /data. It does not start
# until told how it is reached and how it is protected, since beyond
# loopback serve requires TLS and a policy, or --insecure:
#   -e TENURE_ADVERTISE=HOST:7480 and either a config file with the TLS
#   files and the policy (-e TENURE_CONFIG=/etc/tenure/tenure.yaml and a
#   volume at /etc/tenure), or, for a trial reachable from this machine
#   only, -p 127.0.0.1:7480:7480 -e TENURE_INSECURE=true.
# Other settings come the same way (TENURE_<FLAG> or the config file);
# --listen and --data-dir, given here, win over both.
CMD ["serve", "--listen", "0.0.0.0:7480", "--data-dir", "/data"]
