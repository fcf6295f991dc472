# The vgpu-dra driver image. No image is built in this repository's CI (no container engine);
# the chart takes any image through image.repository and image.tag.
#
#   docker build -t vgpu-dra:dev .
#
# The binary is not static on purpose: NVML (libnvidia-ml.so.1) is loaded at run time with
# dlopen, which a static musl binary cannot do with the host's glibc-built driver library. The
# base therefore carries glibc and nothing else; the NVIDIA runtime mounts the library.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p vgpu-dra --bin vgpu-dra \
 && strip target/release/vgpu-dra

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /src/target/release/vgpu-dra /usr/bin/vgpu-dra
# One malloc arena: glibc otherwise gives each thread that allocates (the runtime's workers and
# the blocking pool that writes CDI specs) an arena of its own, which kept ~7 MiB more resident
# with 1,000 claims prepared (BENCHMARKS.md, "Claim reads") for no measurable speed.
ENV MALLOC_ARENA_MAX=1
# No per-thread malloc caches: each thread's tcache keeps up to 7 freed blocks of every small
# size, which malloc_trim cannot give back; across the runtime's threads that kept ~3 MiB more
# resident with 1,000 claims prepared (BENCHMARKS.md, issue 35), for no measurable speed.
ENV GLIBC_TUNABLES=glibc.malloc.tcache_count=0
# The driver writes the kubelet's plugin directories, CDI specs and HAMi-core's host files,
# all root-owned host paths.
USER 0:0
ENTRYPOINT ["/usr/bin/vgpu-dra"]
CMD ["kubelet-plugin"]
