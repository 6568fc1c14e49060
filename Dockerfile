# The sockfleet worker image: a static linux/arm64 binary on a distroless base that
# runs as an unprivileged user. `cdk deploy` builds it as an asset (platform
# linux/arm64); by hand: docker build --platform linux/arm64 -t sockfleet-worker .

# The build stage runs on the build host's own platform and cross-compiles, which
# is fast and needs no emulation; the static binary runs on any linux/arm64 base.
FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux GOARCH=arm64 go build -trimpath -ldflags="-s -w" -o /worker ./worker

# No shell and no package manager: the container health check runs
# `/worker healthcheck`, which probes the worker's own /healthz.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /worker /worker
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/worker"]
