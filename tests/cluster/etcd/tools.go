//go:build tools

// Package etcd pins the etcd release the end-to-end control plane stores its
// state in. Never compiled; it keeps the program in go.mod/go.sum.
package etcd

import _ "go.etcd.io/etcd/server/v3"
