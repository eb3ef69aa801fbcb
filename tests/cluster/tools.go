//go:build tools

// Package cluster pins the control-plane programs the end-to-end tests run.
// The file is never compiled; it only keeps the programs in go.mod/go.sum so
// that `go build` of each one is reproducible and offline once downloaded.
package cluster

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
