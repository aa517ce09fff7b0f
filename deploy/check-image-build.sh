#!/usr/bin/env bash
# The container image's build stage cannot break unseen (part of `make test`,
# through `make deploy-check`). A release build with Swift's runtime linked
# in statically (`--static-swift-stdlib`) has no test framework: a target it
# compiles that imports `Testing` or `XCTest` stops it. Building that binary
# here would cost CI several minutes, so this checks what provably covers it,
# from the manifest as SwiftPM reads it (`swift package dump-package`, no
# build, no dependency resolution):
#
#  1. deploy/Dockerfile has one build command (`RUN swift build ...`), and it
#     builds with `--product` the product whose binary the runtime stage
#     copies (`/out/NAME`): it compiles that product's targets and no others.
#  2. No target that product links, directly or through other targets of
#     this package, imports a test framework.
#  3. No target other than a test target imports one either (a build without
#     `--product`, as the image's was, compiles every non-test target).
#  4. Every folder the manifest names lies inside what the build stage
#     copies (`COPY`), so the manifest loads in the image's build context.
#
# deploy/image-local.sh runs the command of (1) as it stands in the Dockerfile.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKERFILE=${DOCKERFILE:-deploy/Dockerfile}
SWIFT=${SWIFT:-swift}

manifest=$(mktemp /tmp/happypath-manifest.XXXXXX.json)
trap 'rm -f "$manifest"' EXIT
$SWIFT package dump-package > "$manifest"

python3 - "$DOCKERFILE" "$manifest" <<'PY'
import json, os, re, shlex, sys

dockerfile, manifest = sys.argv[1], sys.argv[2]
problems = []

# -- the build stage: its COPY sources, its build command, the binary it hands over
lines, stage, joined = open(dockerfile).read().split("\n"), None, []
buf = ""
for line in lines:
    buf += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
    if not line.endswith("\\"):
        joined.append(buf.strip()); buf = ""
build_copies, build_commands, shipped = [], [], None
for line in joined:
    m = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
    if m:
        stage = (m.group(1) or "").lower(); continue
    if stage == "build" and re.match(r"COPY\s", line, re.I):
        args = [a for a in shlex.split(line)[1:] if not a.startswith("--")]
        build_copies += [os.path.normpath(a) for a in args[:-1]]
    if stage == "build" and re.match(r"RUN\s+swift\s+build\s", line, re.I):
        build_commands.append(line.split(None, 1)[1].split("&&")[0].strip())
    m = re.match(r"COPY\s+--from=build\s+/out/(\S+)\s", line, re.I)
    if m:
        shipped = m.group(1)

if len(build_commands) != 1:
    problems.append(f"{dockerfile}: expected one `RUN swift build ...` in the build stage, found {len(build_commands)}")
if shipped is None:
    problems.append(f"{dockerfile}: the runtime stage copies no /out/NAME binary from the build stage")

m = json.load(open(manifest))
targets = {t["name"]: t for t in m["targets"]}
products = {p["name"]: p for p in m["products"]}

product = None
if build_commands:
    words = shlex.split(build_commands[0])
    named = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--product"]
    named += [w.split("=", 1)[1] for w in words if w.startswith("--product=")]
    if not named:
        problems.append(f"{dockerfile}: `{build_commands[0]}` names no --product: it would compile every "
                        "non-test target of the package; add `--product {}`".format(shipped or "NAME"))
    elif shipped and named[0] != shipped:
        problems.append(f"{dockerfile}: the build command builds product {named[0]!r} but the image ships {shipped!r}")
    else:
        product = named[0]
    if product and product not in products:
        problems.append(f"{dockerfile}: no product named {product!r} in Package.swift (products: {', '.join(products)})")
        product = None

def folder(t):
    if t.get("path"):
        return os.path.normpath(t["path"])
    if t["type"] == "system":
        return os.path.join("Sources", t["name"])
    return os.path.join("Tests" if t["type"] == "test" else "Sources", t["name"])

IMPORT = re.compile(r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*import\s+(?:(?:struct|class|enum|protocol|func|var|let|typealias)\s+)?(Testing|XCTest)\b", re.M)

def importers(t):
    found = []
    for root, _, files in os.walk(folder(t)):
        for f in sorted(files):
            if f.endswith(".swift"):
                p = os.path.join(root, f)
                for hit in IMPORT.finditer(open(p, encoding="utf-8", errors="replace").read()):
                    found.append(f"{p} imports {hit.group(1)}")
    return found

# -- (2) the shipped product's own targets, transitively
seen = set()
if product:
    todo = list(products[product]["targets"])
    while todo:
        name = todo.pop()
        if name in seen or name not in targets:
            continue
        seen.add(name)
        for dep in targets[name]["dependencies"]:
            kind, value = next(iter(dep.items()))
            if kind in ("byName", "target"):
                todo.append(value[0])
    for name in sorted(seen):
        for hit in importers(targets[name]):
            problems.append(f"target {name} (linked into {product}): {hit}; a static-stdlib release build has no test framework")

# -- (3) every non-test target
for name, t in sorted(targets.items()):
    if t["type"] in ("test", "system", "binary", "plugin", "macro"):
        continue
    for hit in importers(t):
        problems.append(f"target {name} is not a test target but {hit}: move that code into the test "
                        "targets that use it (a build without --product compiles every non-test target)")

# -- (4) the manifest's folders inside the build context
for name, t in sorted(targets.items()):
    if t["type"] == "binary":
        continue
    f = folder(t)
    if not any(f == c or f.startswith(c + os.sep) for c in build_copies):
        problems.append(f"target {name}'s folder {f} is not copied into the image's build stage "
                        f"({dockerfile} copies {', '.join(build_copies)}): the manifest would not load there")

if problems:
    print("image build check failed:", file=sys.stderr)
    for p in problems:
        print("  " + p, file=sys.stderr)
    sys.exit(1)
print(f"image build check: ok: `{build_commands[0]}` compiles the {len(seen)} targets {product} links, none imports "
      f"a test framework, nor does any other non-test target; all {len(targets)} targets' folders are in the build context")
PY
