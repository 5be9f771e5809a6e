//go:build !(rdma && linux && cgo)

package ibv

import "github.com/rsockio/rsock/verbs"

// Built reports whether this package was compiled with the rdma-core provider
// (build tag rdma, on Linux, with cgo).
const Built = false

// Open returns ErrNotBuilt: this program was built without the rdma build tag (or
// without cgo, or not for Linux), so it carries no rdma-core provider.
func Open() (verbs.Provider, error) { return nil, ErrNotBuilt }
