//go:build tools

// Package metricsserver pins the metrics-server release the end-to-end
// cluster serves metrics.k8s.io with (for `kubectl top`). Never compiled;
// it keeps the program in go.mod/go.sum.
package metricsserver

import _ "sigs.k8s.io/metrics-server/cmd/metrics-server"
