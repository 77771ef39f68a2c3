# Tessera's entry points. `make` lists them.
SHELL := bash
.DEFAULT_GOAL := help
CARGO ?= cargo

.PHONY: help tools node-deps build demo demo-down test test-unit soak fuzz bench bench-scale gpu-check fmt lint crds cluster cluster-down clean images

help: ## List the targets
	@echo "Tessera: GPU sharing for Kubernetes. Targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

tools: ## Build etcd and Kubernetes v1.36 binaries into ~/.cache/tessera (once; ~10 min cold)
	@hack/tools.sh >/dev/null

node-deps: ## Install what real nodes need (containerd, runc, CNI plugins, busybox; Debian/Ubuntu, as root)
	@hack/node-deps.sh

demo: ## Run Tessera locally: control plane, controller, four real nodes with fake GPUs (one behind the DRA door), examples, a tour
	@# The first run builds only the demo's Go tools, beside the Rust build and the
	@# node packages' download (README: what the first run takes).
	@hack/node-deps.sh demo & deps=$$!; hack/tools.sh demo >/dev/null & tools=$$!; \
	  $(CARGO) build -p tessera-controllers -p tessera-node-agent -p tessera-interposer -p tessera-fake-cuda -p tessera-fake-nvml -p tessera-e2e; built=$$?; \
	  wait $$deps || exit 1; wait $$tools || exit 1; exit $$built
	TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" $(CARGO) run -q -p tessera-e2e --bin tessera-demo -- up

demo-down: ## Stop the demo and remove .tessera-demo
	@# --path: stopping never builds tools (unset, the harness would build the tests' ones).
	TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" $(CARGO) run -q -p tessera-e2e --bin tessera-demo -- down

build: ## Build every crate and binary
	$(CARGO) build --workspace --all-targets

test: tools node-deps ## Run every test, including those against a real kube-apiserver and real nodes (builds what it needs)
	$(CARGO) build --workspace
	TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" $(CARGO) test --workspace --no-fail-fast

test-unit: ## Run only the tests that need no control plane
	$(CARGO) test --workspace --lib --bins --test crds

soak: tools node-deps ## Chaos for ~30 min on real nodes: 400 GPU pods, 60 kills of agents and controller (figures: docs/benchmarks.md)
	$(CARGO) build --workspace
	TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" TESSERA_TEST_TIMEOUT_SECS=3600 TESSERA_CHAOS_PODS=400 \
	  TESSERA_CHAOS_FAULTS=60 TESSERA_CHAOS_MAX_LIVE=40 TESSERA_CHAOS_PACE_MS=2000 \
	  $(CARGO) test -p tessera-e2e --test chaos -- --nocapture

fuzz: ## Run every fuzz/property target for FUZZ_CASES cases each (default 50000; docs/fuzzing.md)
	PROPTEST_CASES=$${FUZZ_CASES:-50000} $(CARGO) test -p tessera-scheduling -p tessera-controllers -p tessera-node-agent -p tessera-draplugin --test fuzz -- --nocapture
	PROPTEST_CASES=$${FUZZ_CASES:-50000} $(CARGO) test -p tessera-interposer -p tessera-vgpu-region --lib fuzz_ -- --nocapture

bench: ## Run the benchmarks (release build; figures go in docs/benchmarks.md)
	$(CARGO) bench -p tessera-controllers --bench filter
	TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" $(CARGO) bench -p tessera-controllers --bench throughput
	TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" $(CARGO) bench -p tessera-node-agent --bench allocate
	$(CARGO) bench -p tessera-interposer --bench alloc
	$(CARGO) build --release -p tessera-controllers -p tessera-node-agent -p tessera-interposer -p tessera-fake-cuda -p tessera-fake-nvml
	TESSERA_ARTIFACTS_DIR="$${CARGO_TARGET_DIR:-$(CURDIR)/target}/release" TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" $(CARGO) bench -p tessera-e2e --bench real_nodes

bench-scale: tools ## Scheduling at 100, 1,000 and 5,000 kwok-simulated GPU nodes (~9 min on 2 cores; BENCH_SCALE_NODES=; figures: docs/benchmarks.md)
	$(CARGO) build --release -p tessera-controllers -p tessera-node-agent -p tessera-interposer -p tessera-fake-cuda -p tessera-fake-nvml -p tessera-bench
	TESSERA_ARTIFACTS_DIR="$${CARGO_TARGET_DIR:-$(CURDIR)/target}/release" TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" \
	  TESSERA_TEST_TIMEOUT_SECS=7200 "$${CARGO_TARGET_DIR:-$(CURDIR)/target}/release/tessera-bench-scale" --out "$${CARGO_TARGET_DIR:-$(CURDIR)/target}/bench-scale"
	@hack/plot-env.sh "$${CARGO_TARGET_DIR:-$(CURDIR)/target}/bench-scale/scale.csv" "$${CARGO_TARGET_DIR:-$(CURDIR)/target}/bench-scale/scale.png"

gpu-check: ## On a machine with an NVIDIA GPU and PyTorch (as root): check the interposer, MIG and MPS against the real driver
	$(CARGO) build --release -p tessera-interposer
	python3 interposer/gpu-check/check.py --library target/release/libtessera_vgpu.so
	python3 interposer/gpu-check/modes.py

images: tools ## Write OCI image archives (controller, node agent, kube-scheduler) to target/images; IMAGES_DIR=, REGISTRY= override
	$(CARGO) build --release -p tessera-controllers -p tessera-node-agent -p tessera-interposer
	$(CARGO) run -q -p tessera-e2e --bin tessera-images -- --artifacts "$${CARGO_TARGET_DIR:-$(CURDIR)/target}/release" \
	  --tools "$$(hack/tools.sh --path)" $(if $(IMAGES_DIR),--out "$(IMAGES_DIR)") $(if $(REGISTRY),--registry "$(REGISTRY)")

fmt: ## Format the code
	$(CARGO) fmt --all

lint: ## Check formatting and run clippy with warnings as errors
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

crds: ## Regenerate crds/*.yaml and the Helm chart's copy from the Rust types in api/src/v1alpha1
	$(CARGO) run -q -p tessera-api --bin tessera-crdgen -- crds
	$(CARGO) run -q -p tessera-api --bin tessera-crdgen -- charts/tessera/crds

cluster: tools ## Start a local control plane with the CRDs; writes .tessera/kubeconfig
	@TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" $(CARGO) run -q -p tessera-e2e --bin tessera-cluster -- up

cluster-down: ## Stop the local control plane and remove .tessera
	@TESSERA_TOOLS_DIR="$$(hack/tools.sh --path)" $(CARGO) run -q -p tessera-e2e --bin tessera-cluster -- down

clean: ## Remove build output (the tool cache in ~/.cache/tessera stays)
	$(CARGO) clean
