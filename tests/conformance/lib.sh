# Shared by the conformance runs (run.sh, the VM lab's conformance suite).
# shellcheck shell=bash

# repo_list REGISTRY: e2e.test's KUBE_TEST_REPO_LIST, every image from the
# local registry REGISTRY (what images.sh pushed there).
repo_list() {
  cat <<YAML
promoterE2eRegistry: $1/e2e-test-images
gcRegistry: $1
gcEtcdRegistry: $1
buildImageRegistry: $1/build-image
sigStorageRegistry: $1/sig-storage
dockerLibraryRegistry: $1/library
privateRegistry: $1/k8s-authenticated-test
cloudProviderGcpRegistry: $1/cloud-provider-gcp
YAML
}

# ci_focus: the CI subset (ci-specs.txt) as one ginkgo focus expression.
ci_focus() {
  grep -v '^\s*#' tests/conformance/ci-specs.txt | grep -v '^\s*$' | paste -sd'|'
}

# The label filter of every run: node conformance, nothing disruptive,
# flaky, slow or behind a feature gate.
CONFORMANCE_SELECTION='!Disruptive && !Flaky && !Slow && !/^Feature:/ && !Alpha && !BetaOffByDefault'
