# The conformance CI subset against the guest node (sourced by
# tests/vm/run.sh --suite conformance once kinglet is installed and its
# node Ready): upstream's own specs (tests/conformance/ci-specs.txt, the
# e2e.test build.sh makes) run from the host through the lab's control
# plane against kinglet on cgroup v2, one at a time (one vCPU). Their
# images come from the lab registry, which the guest's kinglet already
# pulls from (plain HTTP, registries.yaml). Output: target/vm/conformance-ARCH/.
# shellcheck shell=bash
# shellcheck source=../conformance/lib.sh
. "$VM_ROOT/tests/conformance/lib.sh"
cf_out=$VM_ROOT/target/vm/conformance-$VM_ARCH-$VM_RUNTIME
rm -rf "$cf_out"
mkdir -p "$cf_out"
cf_start=$(date +%s)
cf_bin=$(tests/conformance/build.sh | tail -n1)
tests/conformance/images.sh "$cf_bin" "$REGISTRY" >&2
repo_list "$REGISTRY" >"$VM_WORK/repo-list.yaml"
set +e
KUBE_TEST_REPO_LIST=$VM_WORK/repo-list.yaml "$cf_bin/ginkgo" --procs=1 --timeout=60m --no-color --output-dir="$cf_out" --junit-report=junit.xml \
  "$cf_bin/e2e.test" -- --kubeconfig="$KUBECONFIG" --provider=local \
  --kube-test-repo-list="$VM_WORK/repo-list.yaml" --report-dir="$cf_out" --ginkgo.timeout=60m \
  --ginkgo.label-filter="NodeConformance && $CONFORMANCE_SELECTION" --ginkgo.focus="$(ci_focus)" \
  --ginkgo.no-color >"$cf_out/e2e.log" 2>&1
set -e
python3 tests/conformance/report.py "$cf_out" "$(( $(date +%s) - cf_start ))" "vm $VM_ARCH $VM_RUNTIME"
head -n1 "$cf_out/table.txt" | grep -q ' 0 failed' || fail "conformance subset against the guest node: $(head -n1 "$cf_out/table.txt")"
head -n1 "$cf_out/table.txt" | grep -qv ' 0 passed' || fail "conformance subset against the guest node ran nothing"
echo "figure: $(head -n1 "$cf_out/table.txt")"
