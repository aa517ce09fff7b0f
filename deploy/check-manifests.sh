#!/usr/bin/env bash
# Validates every manifest in deploy/k8s offline against the Kubernetes JSON
# schemas (kubernetes-validate --strict: unknown fields are errors), lints the
# YAML, and checks the ConfigMap's embedded config with `happypath check`.
# Usage: deploy/check-manifests.sh [path/to/happypath]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${K8S_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/happypath-k8s-venv}
K8S_VERSION=${K8S_VERSION:-1.30}
if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  echo "installing kubernetes-validate and yamllint into $VENV (once)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q kubernetes-validate yamllint
fi
manifests=(deploy/k8s/*.yaml)
"$VENV/bin/yamllint" -d '{extends: default, rules: {line-length: {max: 160}}}' "${manifests[@]}"
"$VENV/bin/kubernetes-validate" --strict -k "$K8S_VERSION" "${manifests[@]}"
# The config inside the ConfigMap must pass the proxy's own check.
bin=${1:-}
if [ -n "$bin" ] && [ -x "$bin" ]; then
  cfg=$(mktemp /tmp/happypath-configmap.XXXXXX.yaml)
  trap 'rm -f "$cfg"' EXIT
  "$VENV/bin/python" - "$cfg" <<'PY'
import sys, yaml
doc = yaml.safe_load(open("deploy/k8s/configmap.yaml"))
open(sys.argv[1], "w").write(doc["data"]["happypath.yaml"])
PY
  API_CLIENT_ID=check API_CLIENT_SECRET=check "$bin" check --config "$cfg"
fi
echo "deploy-check: ${#manifests[@]} manifests valid for Kubernetes $K8S_VERSION (strict)"
