# syntax=docker/dockerfile:1
#
# leasehold as a container image: a static binary on a distroless base, run as
# a non-root user. Build (from the repository's top level):
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" -t leasehold .
#
# Run: the image's default command is "serve"; it needs DATABASE_URL and an
# API token (a replica that listens beyond its container, as the image's
# :8080 does, refuses to serve without one), and listens on :8080 (see
# docs/operations/deploying.md, docs/operations/security.md and deploy/kubernetes/).
#
#   docker run --rm -p 8080:8080 -e DATABASE_URL=postgres://... \
#     -e LEASEHOLD_API_TOKEN="$(openssl rand -hex 32)" leasehold

# The builder: Go 1.26, as go.mod asks.
FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so that a change to the code alone reuses this layer; the
# caches persist between builds.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
ARG VERSION=dev
# A static binary (no cgo: the final image has no C library), without the
# builder's paths or debug information, with its version stamped in.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/leasehold ./cmd/leasehold

# The image: no shell, no package manager, CA certificates and time zones
# only (for TLS to the database), the binary, and a numeric non-root user, so
# that Kubernetes' runAsNonRoot can check it.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/leasehold /usr/local/bin/leasehold
USER 65532:65532
# Every interface of the container: its own loopback is no use to anyone.
ENV LEASEHOLD_ADDR=:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/leasehold"]
CMD ["serve"]
