#!/usr/bin/env bash
# Builds the runtime image without a Docker engine or registry, runs it, and
# sends a request through it. The runtime recipe is taken from
# deploy/Dockerfile itself (its runtime stage), so the two cannot drift:
# only the base (a Debian bookworm made by debootstrap from Debian's mirror)
# and the binary's origin (built here, with Swift's runtime linked in) differ.
# Needs root: apt-get installs podman, buildah, runc and debootstrap if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in podman buildah runc debootstrap curl; do
  command -v $tool >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah runc debootstrap curl; break; }
done
B="buildah --storage-driver vfs"
P="podman --storage-driver vfs --runtime runc"
ULIM="--ulimit nofile=4096:4096 --ulimit nproc=4096:4096"   # at or below this sandbox's hard limits
CTX=$(mktemp -d /tmp/happypath-image.XXXXXX)
trap 'rm -rf "$CTX"; [ -n "${DEMO:-}" ] && kill $DEMO 2>/dev/null; [ -n "${CID:-}" ] && $P rm -f "$CID" >/dev/null 2>&1; true' EXIT

echo "== 1. release binary with Swift's runtime linked in: deploy/Dockerfile's build command"
BUILD=$(awk '/^RUN swift build /{sub(/^RUN /, ""); sub(/ *(&&.*)?\\?$/, ""); print; exit}' deploy/Dockerfile)
[ -n "$BUILD" ] || { echo "no 'RUN swift build' line in deploy/Dockerfile" >&2; exit 1; }
echo "$BUILD"
$BUILD
cp "$($BUILD --show-bin-path)/happypath" "$CTX/happypath"
mkdir -p "$CTX/config" && cp config/happypath.yaml "$CTX/config/"

echo "== 2. Debian bookworm base (debootstrap, once)"
if ! $P image exists localhost/debian-local:bookworm; then
  MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$MIRROR" ] || MIRROR=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list)
  debootstrap --variant=minbase bookworm "$CTX/rootfs" "$MIRROR" >/dev/null
  rm -rf "$CTX/rootfs/var/cache/apt/archives/"*.deb
  tar -C "$CTX/rootfs" -c . | podman --storage-driver vfs import -q - localhost/debian-local:bookworm >/dev/null
  rm -rf "$CTX/rootfs"
fi

echo "== 3. runtime stage of deploy/Dockerfile, on that base"
awk '/^FROM .* AS runtime/{on=1} on' deploy/Dockerfile \
  | sed -e 's|^FROM .* AS runtime|FROM localhost/debian-local:bookworm|' \
        -e 's|^COPY --from=build /out/happypath |COPY happypath |' > "$CTX/Containerfile"
$B bud --isolation chroot -q -t localhost/happypath:latest -f "$CTX/Containerfile" "$CTX" >/dev/null
$P image inspect localhost/happypath:latest --format 'image: {{.Id}} user={{.Config.User}} entrypoint={{.Config.Entrypoint}}'

echo "== 4. run it (host network) in front of the demo upstream, and send a request"
"$CTX/happypath" demo-upstream --listen 127.0.0.1:19500 >/dev/null 2>&1 & DEMO=$!
cat > "$CTX/run.yaml" <<YAML
listen: 127.0.0.1:19501
admin: { listen: 127.0.0.1:19502 }
upstreams: { demo: { endpoints: [http://127.0.0.1:19500] } }
routes: [ { match: { path_prefix: / }, upstream: demo } ]
YAML
chmod 644 "$CTX/run.yaml"
CID=$($P run -d --network host $ULIM -v "$CTX/run.yaml:/etc/happypath/happypath.yaml:ro" localhost/happypath:latest)
for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:19502/healthz && break; sleep 0.1; done
curl -fsS -i http://127.0.0.1:19501/ok
echo
$P exec "$CID" id
# The delivery store's directory (a VOLUME) is writable by the runtime user,
# and every library the binary links (libsqlite3 among them) is in the image.
$P exec "$CID" sh -c 'touch /var/lib/happypath/.probe && rm /var/lib/happypath/.probe'
echo "store: /var/lib/happypath writable by uid $($P exec "$CID" id -u)"
if $P exec "$CID" ldd /usr/local/bin/happypath | grep 'not found'; then
  echo "FAIL: libraries missing from the image" >&2; exit 1
fi
$P stop -t 10 "$CID" >/dev/null
echo "exit code after SIGTERM: $($P inspect "$CID" --format '{{.State.ExitCode}}')"
echo "OK: localhost/happypath:latest built from deploy/Dockerfile's runtime stage and served a request"
