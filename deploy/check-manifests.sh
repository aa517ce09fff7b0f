#!/usr/bin/env bash
# Validates every manifest in deploy/k8s offline against the Kubernetes JSON
# schemas (kubernetes-validate --strict: unknown fields are errors), lints the
# YAML, checks what the schemas cannot see (where the delivery store lives: a
# SQLite file on a volume of each pod's own, or a PostgreSQL URL from a
# Secret; that the objects point at one another; and that the Redis of
# cluster.redis.url gets its password from a Secret and, when it is a
# Service of these manifests, that the Service has the port and selects
# pods), and checks the ConfigMap's embedded config with `happypath check`.
# Usage: deploy/check-manifests.sh [path/to/happypath]
# K8S_DIR=other/dir checks another set of manifests (the same checks).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${K8S_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/happypath-k8s-venv}
K8S_VERSION=${K8S_VERSION:-1.30}
K8S_DIR=${K8S_DIR:-deploy/k8s}
if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  echo "installing kubernetes-validate and yamllint into $VENV (once)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q kubernetes-validate yamllint
fi
manifests=("$K8S_DIR"/*.yaml)
"$VENV/bin/yamllint" -d '{extends: default, rules: {line-length: {max: 160}}}' "${manifests[@]}"
"$VENV/bin/kubernetes-validate" --strict -k "$K8S_VERSION" "${manifests[@]}"

# The delivery store (deliver later): a request that got 202 is in a SQLite
# file at storage.path, so that file must be on a writable volume of its own
# that outlives the pod. The schemas accept any mount; these checks do not.
"$VENV/bin/python" - "$K8S_DIR" <<'PY'
import glob, os, posixpath, re, sys, yaml

DEFAULT_STORE = "/var/lib/happypath/deliveries.db"   # storage.path when the config has none
k8s_dir = sys.argv[1]
errors = []
def fail(msg): errors.append(msg)

docs = []
for f in sorted(glob.glob(os.path.join(k8s_dir, "*.yaml"))):
    for d in yaml.safe_load_all(open(f)):
        if d:
            docs.append((f, d))
def objects(kind): return [(f, d) for f, d in docs if d.get("kind") == kind]
def named(kind, name): return [d for f, d in objects(kind) if d["metadata"]["name"] == name]
def matches(selector, labels):   # matchLabels only; this project uses no expressions
    want = selector.get("matchLabels", selector)
    return bool(want) and all(labels.get(k) == v for k, v in want.items())

def store_path(config_text, where):
    """storage.path of a happypath config, ${VAR:-default} taken as its default; None if unusable."""
    cfg = yaml.safe_load(config_text) or {}
    path = str(((cfg.get("storage") or {}).get("path")) or DEFAULT_STORE)
    path = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", path)
    if "${" in path:
        return fail(f"{where}: storage.path {path!r} depends on the environment; give it a default (${{VAR:-/path}})")
    if not path.startswith("/"):
        return fail(f"{where}: storage.path {path!r} is relative; the process's directory is / (read-only)")
    return posixpath.normpath(path)

def mount_of(mounts, path):
    """The mount that holds path: the longest mountPath that is path or a parent of it."""
    best = None
    for m in mounts:
        mp = posixpath.normpath(m["mountPath"])
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (best is None or len(mp) > len(posixpath.normpath(best["mountPath"]))):
            best = m
    return best

def store_url(config_text):
    """storage.url of a happypath config (the shared PostgreSQL store), or None."""
    cfg = yaml.safe_load(config_text) or {}
    url = (cfg.get("storage") or {}).get("url")
    return None if url is None else str(url)

def uses_store(config_text):
    """Whether a happypath config opens a delivery store: a route delivers later (Configuration.usesStore)."""
    cfg = yaml.safe_load(config_text) or {}
    return any(((r or {}).get("delivery") or {}).get("mode") == "later" for r in cfg.get("routes") or [])

def secret_giving(c, name):
    """(Secret, key) of these manifests that gives container c the variable name, or None."""
    secret = None
    for e in c.get("env", []):
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if e.get("name") == name and ref:
            secret = (ref["name"], ref["key"])
    for e in c.get("envFrom", []):
        sref = e.get("secretRef")
        for sd in named("Secret", sref["name"]) if sref else []:
            if name in (sd.get("stringData") or {}) or name in (sd.get("data") or {}):
                secret = (sref["name"], name)
    return secret

def check_redis(wf, c, cm_name, config_text):
    """cluster.redis.url: its password from a Secret, and a host named by a Service here that selects pods."""
    cfg = yaml.safe_load(config_text) or {}
    url = ((cfg.get("cluster") or {}).get("redis") or {}).get("url")
    if url is None:
        return
    m = re.fullmatch(r"rediss?://(?:([^@/]*)@)?([^/:@]+)(?::(\d+))?(?:/.*)?", str(url).strip())
    if not m:
        return fail(f"ConfigMap {cm_name}: cluster.redis.url {url!r} is not redis://[:password@]host[:port][/db]")
    credentials, host, port = m.group(1) or "", m.group(2), int(m.group(3) or 6379)
    password = credentials.split(":", 1)[-1]
    secrets = []
    if password:
        var = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", password)
        if not var:
            return fail(f"ConfigMap {cm_name}: cluster.redis.url has its password written in the ConfigMap;"
                        " make it ${VAR} and put the password in a Secret")
        secret = secret_giving(c, var.group(1))
        if secret is None:
            return fail(f"{wf}: cluster.redis.url's password is ${{{var.group(1)}}}, which no Secret of these manifests"
                        " gives the container")
        secrets.append(f"password from Secret {secret[0]} key {secret[1]}")
    # A Redis of these manifests (host a Service's name): the Service has the port and selects pods here.
    svc = named("Service", host.split(".")[0]) if "." not in host or ".svc" in host else []
    if not svc:
        if not errors:
            print(f"cluster: Redis at {host}:{port}, not a Service of these manifests" + "".join(f", {x}" for x in secrets))
        return
    if not any(p.get("port") == port for p in svc[0]["spec"].get("ports", [])):
        return fail(f"Service {svc[0]['metadata']['name']} has no port {port}, which cluster.redis.url names")
    pods = [f"{d['kind']}/{d['metadata']['name']}" for _, d in docs if d.get("kind") in ("StatefulSet", "Deployment")
            and matches(svc[0]["spec"].get("selector", {}), d["spec"]["template"]["metadata"].get("labels", {}))]
    if not pods:
        return fail(f"Service {svc[0]['metadata']['name']} (cluster.redis.url) selects the pods of no workload here")
    if not errors:
        print(f"cluster: Redis at {host}:{port}, Service {svc[0]['metadata']['name']} of {', '.join(pods)}"
              + "".join(f", {x}" for x in secrets))

def check_refs(wf, w, spec, labels, wname):
    """The objects that point at the workload find it."""
    if w["kind"] == "StatefulSet":
        svcs = named("Service", spec.get("serviceName", ""))
        if not svcs:
            fail(f"{wf}: serviceName {spec.get('serviceName')!r} is not a Service of these manifests")
        elif svcs[0]["spec"].get("clusterIP") != "None" or not matches(svcs[0]["spec"].get("selector", {}), labels):
            fail(f"{wf}: Service {spec['serviceName']} must be headless (clusterIP: None) and select the pods")
    if not any(matches(s["spec"].get("selector", {}), labels) and s["spec"].get("clusterIP") != "None"
               for _, s in objects("Service")):
        fail(f"{wf}: no Service with a virtual IP selects the pods (the one clients use)")
    for hf, h in objects("HorizontalPodAutoscaler"):
        ref = h["spec"]["scaleTargetRef"]
        if (ref.get("kind"), ref.get("name")) != (w["kind"], w["metadata"]["name"]):
            fail(f"{hf}: HorizontalPodAutoscaler targets {ref.get('kind')}/{ref.get('name')}, not {wname}")
    for pf, p in objects("PodDisruptionBudget"):
        if not matches(p["spec"].get("selector", {}), labels):
            fail(f"{pf}: PodDisruptionBudget {p['metadata']['name']} does not select the pods of {wname}")

# The proxy's workload: the one whose pods run the happypath image.
workloads = [(f, d) for f, d in docs if d.get("kind") in ("StatefulSet", "Deployment")
             and any("happypath" in c.get("image", "") for c in d["spec"]["template"]["spec"]["containers"])]
if len(workloads) != 1:
    fail(f"expected one workload running the happypath image, found {len(workloads)}")
    workloads = []
for wf, w in workloads:
    wname, spec = f"{w['kind']}/{w['metadata']['name']}", w["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    c = next(c for c in pod["containers"] if "happypath" in c.get("image", ""))
    mounts = c.get("volumeMounts", [])
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"]: t for t in spec.get("volumeClaimTemplates", [])}

    # The config the pod reads is the ConfigMap checked here.
    args = c.get("args", [])
    config_file = args[args.index("--config") + 1] if "--config" in args else "/etc/happypath/happypath.yaml"
    cm_mount = mount_of(mounts, config_file)
    cm_name = (volumes.get(cm_mount["name"], {}).get("configMap") or {}).get("name") if cm_mount else None
    cms = named("ConfigMap", cm_name) if cm_name else []
    if not cms:
        fail(f"{wf}: --config {config_file} is not on a ConfigMap volume of these manifests")
        continue
    key = posixpath.relpath(config_file, cm_mount["mountPath"])
    if key not in cms[0].get("data", {}):
        fail(f"{wf}: ConfigMap {cm_name} has no key {key!r} for --config {config_file}")
        continue
    check_redis(wf, c, cm_name, cms[0]["data"][key])
    url = store_url(cms[0]["data"][key])
    if url is not None:
        # The shared store: nothing per pod; the URL (with its password) from a Secret.
        var = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", url.strip())
        if not var:
            fail(f"ConfigMap {cm_name}: storage.url is written in the ConfigMap; make it ${{VAR}} and put the URL in a Secret")
        else:
            name = var.group(1)
            secret = secret_giving(c, name)
            if secret is None:
                fail(f"{wf}: storage.url is ${{{name}}}, which no Secret of these manifests gives the container")
            elif not errors:
                print(f"store: PostgreSQL (storage.url from Secret {secret[0]} key {secret[1]}), shared by every replica of {wname}")
        check_refs(wf, w, spec, labels, wname)
        continue
    # Durable state per replica: only a StatefulSet gives each pod its own volume back.
    if w["kind"] != "StatefulSet":
        fail(f"{wf}: {wname} holds a delivery store per pod; it must be a StatefulSet with volumeClaimTemplates")
    store = store_path(cms[0]["data"][key], f"ConfigMap {cm_name} {key}")
    if store is None:
        continue
    store_dir = posixpath.dirname(store)

    # The store's directory is its own mount: writable, persistent, per replica.
    m = mount_of(mounts, store)
    if m is None or posixpath.normpath(m["mountPath"]) != store_dir:
        fail(f"{wf}: no volume mounted at {store_dir}, the directory of storage.path {store}"
             + (f" (it is under {m['mountPath']}, volume {m['name']})" if m else ""))
    else:
        if m.get("readOnly"):
            fail(f"{wf}: the store mount {store_dir} is readOnly; SQLite writes the file, its -wal and -shm there")
        if m.get("subPath") or m.get("subPathExpr"):
            fail(f"{wf}: the store mount {store_dir} uses a subPath; mount the whole volume")
        claim = claims.get(m["name"])
        if claim is None:
            kind = next(iter(set(volumes.get(m["name"], {})) - {"name"}), "nothing")
            fail(f"{wf}: the store mount {store_dir} is volume {m['name']!r} ({kind}), not one of the volumeClaimTemplates:"
                 " what got 202 would not survive the pod")
        else:
            modes = claim["spec"].get("accessModes", [])
            if not set(modes) <= {"ReadWriteOnce", "ReadWriteOncePod"} or not modes:
                fail(f"{wf}: volumeClaimTemplate {m['name']} has accessModes {modes}; one writer per store: ReadWriteOnce")
            if not claim["spec"].get("resources", {}).get("requests", {}).get("storage"):
                fail(f"{wf}: volumeClaimTemplate {m['name']} requests no storage size")
    for other in mounts:   # nothing mounted inside the store directory would hide the file
        mp = posixpath.normpath(other["mountPath"])
        if mp != store_dir and mp.startswith(store_dir.rstrip("/") + "/"):
            fail(f"{wf}: {other['mountPath']} is mounted inside the store directory {store_dir}")

    # Writable by the proxy's user: the volume's group is fsGroup.
    psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
    group = csc.get("runAsGroup", psc.get("runAsGroup"))
    if psc.get("fsGroup") is None:
        fail(f"{wf}: no securityContext.fsGroup; the store volume would not be writable by a non-root user")
    elif group is not None and psc["fsGroup"] != group:
        fail(f"{wf}: fsGroup {psc['fsGroup']} is not the process's group {group}")
    # SQLite's temporary files go to /tmp: it must be writable when the root is not.
    if csc.get("readOnlyRootFilesystem"):
        t = mount_of(mounts, "/tmp")
        if t is None or t.get("readOnly"):
            fail(f"{wf}: readOnlyRootFilesystem and no writable volume at /tmp (SQLite's temporary files)")

    check_refs(wf, w, spec, labels, wname)
    if not errors:
        size = claims[m["name"]]["spec"]["resources"]["requests"]["storage"]
        print(f"store: {store} on {wname} volume {m['name']} ({'/'.join(claims[m['name']]['spec']['accessModes'])}, {size},"
              f" one per replica), writable by fsGroup {psc['fsGroup']}")

# A PrometheusRule carries the alert rules of deploy/prometheus (which
# `make rules-check` tests with promtool), unchanged.
for pf, pr in objects("PrometheusRule"):
    rules = yaml.safe_load(open("deploy/prometheus/happypath-rules.yaml"))
    if pr.get("spec") != rules:
        fail(f"{pf}: its groups differ from deploy/prometheus/happypath-rules.yaml; run python3 deploy/prometheus/prometheusrule.py")
    else:
        print(f"alerts: {pf} has the {sum(len(g['rules']) for g in rules['groups'])} rules of deploy/prometheus/happypath-rules.yaml")

# The compose files that run the proxy keep the store on a named volume too
# (when their config has a route that delivers later: without one the proxy
# opens no store).
if k8s_dir == "deploy/k8s":
    for cf in sorted(glob.glob("deploy/compose*.yaml")):
        compose = yaml.safe_load(open(cf)) or {}
        for sname, svc in (compose.get("services") or {}).items():
            if "happypath" not in str(svc.get("image", "")) or "demo-upstream" in (svc.get("command") or []):
                continue
            binds = [v.split(":") for v in svc.get("volumes", []) if isinstance(v, str)]
            cfg_src = next((b[0] for b in binds if len(b) > 1 and b[1] == "/etc/happypath/happypath.yaml"), None)
            text = open(posixpath.join("deploy", cfg_src)).read() if cfg_src else ""
            if store_url(text) is not None:
                env = svc.get("environment") or {}
                var = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", store_url(text).strip())
                if not var or var.group(1) not in env:
                    fail(f"{cf}: service {sname}: storage.url must be ${{VAR}} with VAR in the service's environment")
                else:
                    print(f"store: {cf} service {sname} shares PostgreSQL ({var.group(1)})")
                continue
            store = store_path(text, f"{cf} {sname}")
            if store is None:
                continue
            store_dir = posixpath.dirname(store)
            named_vols = compose.get("volumes") or {}
            if any(len(b) > 1 and b[1] == store_dir and b[0] in named_vols and not b[2:3] == ["ro"] for b in binds):
                print(f"store: {cf} service {sname} keeps {store_dir} on a named volume")
            elif not uses_store(text):
                # Replicas of one service would share a named volume, so one without a store has none.
                print(f"store: {cf} service {sname} opens no store (no route delivers later)")
            else:
                fail(f"{cf}: service {sname} has no writable named volume at {store_dir} (storage.path's directory)")

for e in errors:
    print(f"deploy-check: {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
PY

# The config inside the ConfigMap must pass the proxy's own check.
bin=${1:-}
if [ -n "$bin" ] && [ -x "$bin" ]; then
  cfg=$(mktemp /tmp/happypath-configmap.XXXXXX.yaml)
  trap 'rm -f "$cfg"' EXIT
  "$VENV/bin/python" - "$cfg" "$K8S_DIR" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[2] + "/configmap.yaml"))
open(sys.argv[1], "w").write(doc["data"]["happypath.yaml"])
PY
  HAPPYPATH_STORE_URL=postgres://check@localhost/check API_CLIENT_ID=check API_CLIENT_SECRET=check REDIS_PASSWORD=check \
    "$bin" check --config "$cfg"
fi
echo "deploy-check: ${#manifests[@]} manifests valid for Kubernetes $K8S_VERSION (strict)"
