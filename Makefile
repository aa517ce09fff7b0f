# happypath — the two commands a newcomer needs: `make run` and `make test`.
# Both install what is missing (Debian packages), then build.

SHELL := /bin/bash
SWIFT ?= swift
CONFIG ?= config/happypath.yaml
# Where `make run` and `make check` keep deliver-later requests (config/happypath.yaml
# reads it from HAPPYPATH_STORE; without it, /var/lib/happypath/deliveries.db).
export HAPPYPATH_STORE ?= /tmp/happypath-run/deliveries.db
DEMO_LISTEN ?= 127.0.0.1:9000

# Debian packages: build/run needs the first list, the load-test scenarios and
# the manifest check the second, the side-by-side benchmark the third.
RUNTIME_PACKAGES := libevent-dev libcurl4-openssl-dev libssl-dev libsqlite3-dev libpq-dev libnghttp2-dev libhiredis-dev pkg-config
TEST_PACKAGES := wrk curl openssl python3 python3-venv python3-matplotlib postgresql redis-server prometheus nghttp2-client chromium
BENCH_PACKAGES := nginx haproxy caddy util-linux iproute2 valgrind linux-perf binutils

.PHONY: docs-check rules-check all deps test-deps bench-deps build release run test unit-test swift-test check bench bench-peers bench-counts bench-tls bench-h2 bench-grpc bench-resilience bench-deliver-later bench-overload bench-cluster deploy-check image-local loadtest loadtest-short loadtest-deliver-later soak soak-short sanitize sanitize-thread sanitize-address clean fuzz fuzz-short

all: build

# Installs only what dpkg does not already have; needs root (or sudo).
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
endef

deps:
	$(call apt_install,$(RUNTIME_PACKAGES))

test-deps: deps
	$(call apt_install,$(TEST_PACKAGES))

bench-deps: test-deps
	$(call apt_install,$(BENCH_PACKAGES))

# Only the product: the fuzz targets and the llhttp oracle (swift-nio) are
# built by `make test` and `make fuzz`, not by `make run`.
build: deps
	$(SWIFT) build --product happypath

release: deps
	$(SWIFT) build -c release --product happypath

# The proxy on :8080 (config/happypath.yaml) in front of the demo upstream on :9000.
run: release
	@bin=$$($(SWIFT) build -c release --show-bin-path)/happypath; \
	$$bin check --config $(CONFIG) || exit 1; \
	$$bin demo-upstream --listen $(DEMO_LISTEN) & demo=$$!; \
	trap 'kill $$demo 2>/dev/null' EXIT INT TERM; \
	sleep 0.3; \
	echo "try: curl -i http://127.0.0.1:8080/api/ok   (Ctrl-C stops both)"; \
	$$bin serve --config $(CONFIG) --log-format text

# Every test: the architecture map against the tree (docs-check, first:
# it takes a second), the Kubernetes manifests, the alert rules, each load-test
# scenario in its short form (about 10 s each), a one-minute soak, and the
# unit and loopback integration tests under ThreadSanitizer (the suites
# that run threads and loops) and AddressSanitizer (every suite, every fuzz
# seed and every input that once crashed a fuzz target among them). Those
# two runs are the test runs: a plain `swift test` (`make swift-test`, the
# inner loop) would run the same assertions a third time, and a full build
# costs about 7 minutes on two cores; the tests that bound the proxy's
# resident memory run the plain binary there (HAPPYPATH_PLAIN_BINARY), so
# their bounds are checked too. Fuzzing itself (`make fuzz-short`, `make
# fuzz`: a release build of its own, 3 minutes) is not part of it. About
# 28 minutes from a clean clone on two cores (README, "Soak and sanitizers").
test: docs-check deploy-check rules-check loadtest-short soak-short sanitize

# The map in docs/architecture.md (the folders of Sources/, their line
# counts, the largest files) is generated from the tree and
# docs/architecture-map.txt, so a folder added, moved or grown without the
# page following fails here; `deploy/architecture-map.sh --write` rewrites
# it. It needs only bash and python3 (installed here if missing, before
# the other test packages) and takes well under a second, so it runs first
# in `make test` and fails fast.
docs-check:
	$(call apt_install,python3)
	deploy/architecture-map.sh --check

# The swift test runs of `make test` run every suite: those that need a
# PostgreSQL server (initdb) or promtool, which a plain `swift test` skips
# with a one-line reason when they are missing, fail here instead (test-deps
# installs both).
REQUIRE_SERVICES := HAPPYPATH_TEST_SERVICES=required

# The alert rules (deploy/prometheus): valid, and each alert fires on the
# synthetic series of happypath-rules.test.yaml and stays quiet on the others.
rules-check: test-deps
	promtool check rules deploy/prometheus/happypath-rules.yaml
	cd deploy/prometheus && promtool test rules happypath-rules.test.yaml

# The fast inner loop: the pure targets' tests (core, config, policies, admin, the
# llhttp oracle, the fuzz seeds replayed) and the I/O layer's in-memory ones
# (nghttp2 sessions): no sockets, stores or services; seconds
# once built. The build is of every test target (one test binary).
UNIT_TESTS := HappyPathCoreTests|HappyPathIOTests|HappyPathConfigTests|HappyPathPoliciesTests|HappyPathAdminTests|HappyPathHTTPOracleTests|HappyPathFuzzSeedTests
unit-test: deps
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build --disable-xctest --filter '^($(UNIT_TESTS))\.'

# Every swift test: the unit tests above, the store's, and the loopback
# integration tests (real proxies, upstreams, PostgreSQL and promtool).
swift-test: test-deps
	$(SWIFT) build --build-tests
	$(REQUIRE_SERVICES) $(SWIFT) test --skip-build --disable-xctest

# Validates deploy/k8s/*.yaml (a StatefulSet, a SQLite store per pod) and
# deploy/k8s-postgres/*.yaml (a Deployment on the shared PostgreSQL store)
# offline against the Kubernetes schemas (strict), and checks that the
# container image's build command would build (deploy/check-image-build.sh:
# it names the product it ships, nothing that product links imports a test
# framework, the manifest loads in the image's build context; seconds).
deploy-check: test-deps build
	deploy/check-image-build.sh
	deploy/check-manifests.sh $$($(SWIFT) build --show-bin-path)/happypath
	K8S_DIR=deploy/k8s-postgres deploy/check-manifests.sh $$($(SWIFT) build --show-bin-path)/happypath

# Builds the binary with deploy/Dockerfile's own build command, then its
# runtime stage with buildah/podman (no Docker engine needed), runs it as uid
# 10001, sends a request through it and stops it with SIGTERM. Needs root.
image-local: deps
	deploy/image-local.sh

# make loadtest SCENARIO=steady|flaky|outage|token-storm|breaker|throttled|tail|overload|coalesce (30 s; chart in /tmp/happypath-loadtest)
SCENARIO ?= steady
loadtest: test-deps release
	HAPPYPATH_BIN=$$($(SWIFT) build -c release --show-bin-path)/happypath deploy/loadtest/run.sh $(SCENARIO)

LOADTEST_SCENARIOS := steady flaky outage token-storm breaker throttled tail overload coalesce
loadtest-short: test-deps build
	@for s in $(LOADTEST_SCENARIOS); do \
	  HAPPYPATH_BIN=$$($(SWIFT) build --show-bin-path)/happypath deploy/loadtest/run.sh $$s --short || exit 1; \
	done
	HAPPYPATH_BIN=$$($(SWIFT) build --show-bin-path)/happypath deploy/loadtest/deliver-later.sh --short

# Deliver later, nothing lost: 10,000 POSTs accepted (202) while the upstream
# is down, then delivered while the proxy is killed with SIGKILL twice and
# restarted on the same store; every 202 must arrive, duplicates only from
# rounds in flight at a kill (deploy/loadtest/deliver-later.sh; --short in loadtest-short).
loadtest-deliver-later: test-deps release
	HAPPYPATH_BIN=$$($(SWIFT) build -c release --show-bin-path)/happypath deploy/loadtest/deliver-later.sh

# A long run with faults (deploy/soak/run.sh): 25% upstream 503s, a 10 s
# outage every 2 minutes, a token expiry every minute, a reload every 30 s.
# Memory, descriptors, parked and in-flight requests sampled every second
# (CSV and SVG chart in /tmp/happypath-soak). SOAK_S shortens it.
SOAK_S ?= 600
soak: test-deps release
	SOAK_S=$(SOAK_S) HAPPYPATH_BIN=$$($(SWIFT) build -c release --show-bin-path)/happypath deploy/soak/run.sh

# The one-minute soak of `make test` runs without the hostile clients (HOSTILE=0):
# with them, one normal request in about 170,000 failed once (UPSTREAM_UNAVAILABLE,
# before the first outage: the health checks of the one-loop demo upstream timed
# out under the hostile clients' first burst). They now have a demo upstream of
# their own; `make soak` runs with them.
soak-short: test-deps build
	HOSTILE=0 SOAK_S=60 TOKEN_TTL=20 HAPPYPATH_BIN=$$($(SWIFT) build --show-bin-path)/happypath deploy/soak/run.sh

# The test suite under ThreadSanitizer, then under AddressSanitizer
# (LeakSanitizer included), each in a build folder of its own. Every
# process reports to $(SANITIZER_LOGS) (the test runner and each proxy a
# test starts); any report there fails the run. Narrow it with
# SANITIZE_FILTER="--filter Resilience". ThreadSanitizer's build leaves out
# the single-threaded targets' tests, the llhttp oracle and the fuzz
# targets (HAPPYPATH_BUILD=tsan, Package.swift). The plain product (`build`)
# is the proxy of the tests that bound its resident memory.
SANITIZER_LOGS ?= /tmp/happypath-sanitizers
SANITIZE_FILTER ?=
PLAIN_BINARY = HAPPYPATH_PLAIN_BINARY=$$($(SWIFT) build --show-bin-path)/happypath
# One after the other: run at once (each keeps about one and a half of two
# cores busy) they took 621 s against 685 s, and a test that times a TLS
# handshake failed under the load.
sanitize: sanitize-thread sanitize-address

sanitize-thread: deps build
	HAPPYPATH_BUILD=tsan $(SWIFT) build --build-tests --sanitize=thread --scratch-path .build-tsan
	@rm -rf $(SANITIZER_LOGS)/thread && mkdir -p $(SANITIZER_LOGS)/thread
	$(REQUIRE_SERVICES) $(PLAIN_BINARY) TSAN_OPTIONS="log_path=$(SANITIZER_LOGS)/thread/report second_deadlock_stack=1" \
	  HAPPYPATH_BUILD=tsan $(SWIFT) test --skip-build --disable-xctest --sanitize=thread --scratch-path .build-tsan $(SANITIZE_FILTER)
	@deploy/sanitizer-reports.sh $(SANITIZER_LOGS)/thread ThreadSanitizer

sanitize-address: deps build
	$(SWIFT) build --build-tests --sanitize=address --scratch-path .build-asan
	@rm -rf $(SANITIZER_LOGS)/address && mkdir -p $(SANITIZER_LOGS)/address
	$(REQUIRE_SERVICES) $(PLAIN_BINARY) ASAN_OPTIONS="log_path=$(SANITIZER_LOGS)/address/report detect_leaks=1 suppressions=$(CURDIR)/deploy/asan-suppressions.txt" \
	LSAN_OPTIONS="suppressions=$(CURDIR)/deploy/lsan-suppressions.txt print_suppressions=0" \
	  $(SWIFT) test --skip-build --disable-xctest --sanitize=address --scratch-path .build-asan $(SANITIZE_FILTER)
	@deploy/sanitizer-reports.sh $(SANITIZER_LOGS)/address AddressSanitizer

check: build
	$$($(SWIFT) build --show-bin-path)/happypath check --config $(CONFIG)

# The benchmark, all of it in this repository (deploy/bench/), one run:
#  bench-peers: wrk through nginx, HAProxy, Caddy and happypath (foundation
#    profile, and config/happypath.yaml with every policy and the access log
#    on) in front of one nginx upstream, pinned and unpinned; CPU µs/request,
#    p99, resident memory after 400 connections, and the bars of docs/performance.md.
#  bench-counts: instructions (callgrind) and system calls (perf trace) per
#    request, happypath beside nginx. Needs root (uprobes).
#  bench-tls: TLS keep-alive requests and handshakes, happypath beside nginx.
#  bench-h2: HTTP/2 (h2c, h2load) beside HTTP/1.1 (wrk), happypath beside nginx.
#  bench-grpc: gRPC unary calls (h2load, one framed message), happypath beside nginx grpc_pass.
#  bench-resilience: the policies' cost, 25% upstream 503s, 1,000 parked requests.
#  bench-deliver-later: requests/s a deliver-later route accepts (sync full/normal),
#    then on PostgreSQL (one proxy; two proxies on one database; over a backlog).
#  bench-cluster: a route's rate limit counted in the process, or in Redis
#    (scope: cluster, leases auto and of 1): requests/s, CPU per request, p50/p99.
#  bench-overload: a 12x spike of sheddable traffic on an upstream of fixed capacity,
#    no limit / fixed max_connections / adaptive concurrency with priorities; then the
#    adaptive limit under a slow path, slow readers and a flood on a slow path (issue 44).
# Shorter: make bench BENCH_ENV="REPEATS=1 MODES=pinned DURATION=5s"
# Against an older build: BENCH_ENV="BASELINE_BIN=/path/to/old/happypath"
BENCH_ENV ?=
bench: bench-peers bench-counts bench-tls bench-h2 bench-grpc bench-resilience bench-deliver-later bench-overload bench-cluster

bench-peers: bench-deps release
	env $(BENCH_ENV) HAPPYPATH_BIN=$$($(SWIFT) build -c release --show-bin-path)/happypath \
	  deploy/bench/peers.sh

bench-counts: bench-deps release
	env $(BENCH_ENV) deploy/bench/counts.sh $$($(SWIFT) build -c release --show-bin-path)/happypath

bench-cluster: bench-deps release
	env $(BENCH_ENV) deploy/bench/cluster.sh $$($(SWIFT) build -c release --show-bin-path)/happypath

# TLS termination beside nginx (same certificate): keep-alive requests and handshakes, plain rows beside them.
bench-tls: bench-deps release
	env $(BENCH_ENV) deploy/bench/tls.sh $$($(SWIFT) build -c release --show-bin-path)/happypath

# HTTP/2 at the edge beside nginx (h2c by prior knowledge, h2load -m1 and -m100), HTTP/1.1 rows
# from the same run; bar: each HTTP/2 ratio happypath/nginx within 1.3x of the HTTP/1.1 one.
# h2load comes with nghttp2-client (TEST_PACKAGES, which bench-deps installs).
bench-h2: bench-deps release
	env $(BENCH_ENV) deploy/bench/h2.sh $$($(SWIFT) build -c release --show-bin-path)/happypath

# gRPC unary calls (h2load -d with one framed message), happypath's
# `grpc: {}` route beside nginx's grpc_pass, in front of one upstream that
# answers as a gRPC server does: CPU per call and the ratio, one run with an
# h2c upstream, one with a TLS (ALPN h2) upstream.
bench-grpc: bench-deps release
	env $(BENCH_ENV) GRPC=1 deploy/bench/h2.sh $$($(SWIFT) build -c release --show-bin-path)/happypath
	env $(BENCH_ENV) GRPC=tls deploy/bench/h2.sh $$($(SWIFT) build -c release --show-bin-path)/happypath

# Policies' cost on the happy path, 25% upstream 503s, a 10 s outage with 1,000 parked requests.
bench-resilience: bench-deps release
	env $(BENCH_ENV) deploy/bench/resilience.sh $$($(SWIFT) build -c release --show-bin-path)/happypath

# Deliver later, the accept path: requests/s a later route stores and answers 202
# (sync: full, then normal), upstream down (accept only), then up (accept and
# deliver); wrk -c64 and -c256; store write p99 from /metrics; fsyncs (perf). Bar: 5,000/s.
bench-deliver-later: test-deps release
	env $(BENCH_ENV) deploy/bench/deliver-later.sh $$($(SWIFT) build -c release --show-bin-path)/happypath
	env $(BENCH_ENV) deploy/bench/deliver-later-postgres.py $$($(SWIFT) build -c release --show-bin-path)/happypath

# Overload (issue 35): the `overload` load-test scenario at full length (10 s, a 20 s
# spike, 10 s; about 2.5 minutes for the three configurations), the adaptive row's
# targets printed PASS/FAIL (BENCH_ENV="CHECK_TARGETS=1" makes a FAIL fail the target).
# Table, CSVs and chart in /tmp/happypath-loadtest/overload (docs/performance.md,
# "The overload scenario"). Then the adaptive limit's attacks (issue 44: a slow path,
# slow readers, a sheddable flood on a slow path; 20 s each against no limit, min_limit 2
# and the default; about 3 minutes): overload-attacks.md, .csv and .png beside them.
bench-overload: test-deps release
	env $(BENCH_ENV) HAPPYPATH_BIN=$$($(SWIFT) build -c release --show-bin-path)/happypath deploy/loadtest/overload.sh
	$$([ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3) deploy/loadtest/overload-attacks.py \
	  --bin $$($(SWIFT) build -c release --show-bin-path)/happypath \
	  --out $${OUT:-/tmp/happypath-loadtest}/overload $$(case "$(BENCH_ENV)" in *CHECK_TARGETS=1*) echo --check;; esac)

clean:
	rm -rf .build

# libFuzzer: each target runs FUZZ_SECONDS (default 60) from a corpus in
# .build-fuzz/corpus/<target>, seeded from Tests/FuzzSeeds/<target>. A crash
# input lands in .build-fuzz/crashes/<target>/; replay it without the fuzzer:
#   swift build --product <target> && $(swift build --show-bin-path)/<target> <crash file>
# (-DFUZZING selects the fuzz entry point, which starts libFuzzer's driver;
# -parse-as-library because that build has no top-level code. SWIFT_BACKTRACE=enable=no:
# Swift's own backtracer would take the trap before libFuzzer saves the input.)
# `make fuzz-short` is the same run, FUZZ_SHORT_SECONDS
# (default 10) per target: about 2 minutes to build from a clean clone and
# 70 s to run; every seed goes through each target's check first. Both keep
# .build-fuzz/corpus between runs (a clean clone starts from the seeds); -max_len is fixed so that libFuzzer does not
# derive it from whatever the corpus holds. A new target is one more name in
# FUZZ_TARGETS; FuzzSeedReplayTests (swift test) fails until its seed folder
# and its check (a line in that test's table) are there too.
FUZZ_SECONDS ?= 60
FUZZ_SHORT_SECONDS ?= 10
FUZZ_TARGETS := FuzzRequestParser FuzzResponseHead FuzzDifferential FuzzConfig FuzzConnection FuzzOutsideValues FuzzHTTP2 FuzzHTTP2Client FuzzRedisReply
FUZZ_BUILD := $(SWIFT) build -c release --scratch-path .build-fuzz \
	-Xswiftc -sanitize=fuzzer -Xswiftc -parse-as-library -Xswiftc -DFUZZING
# $(call fuzz_run,SECONDS): builds every target, runs each SECONDS, fails if any crashed.
define fuzz_run
	@for t in $(FUZZ_TARGETS); do $(FUZZ_BUILD) --product $$t || exit 1; done
	@bin=$$($(FUZZ_BUILD) --show-bin-path); failed=""; \
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p .build-fuzz/corpus/$$t .build-fuzz/crashes/$$t; \
	  echo "== $$t: $(1) s"; \
	  SWIFT_BACKTRACE=enable=no $$bin/$$t -max_total_time=$(1) -max_len=4096 -print_final_stats=1 \
	    -artifact_prefix=.build-fuzz/crashes/$$t/ .build-fuzz/corpus/$$t Tests/FuzzSeeds/$$t \
	    || failed="$$failed $$t"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: crashes in:$$failed (inputs in .build-fuzz/crashes/)"; exit 1; fi
endef

fuzz: deps
	$(call fuzz_run,$(FUZZ_SECONDS))

fuzz-short: deps
	$(call fuzz_run,$(FUZZ_SHORT_SECONDS))
