//go:build rdma && linux && cgo

package ibv

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs"
)

// TestPollSetsEveryField: cq.Poll fills each verbs.WorkCompletion field by field, into
// the caller's slice, which may hold an earlier completion: a field added to the type
// and not set there would carry that completion's value. This counts the fields Poll
// sets.
func TestPollSetsEveryField(t *testing.T) {
	const setByPoll = 9 // WRID, Status, Opcode, VendorErr, ByteLen, Imm, QPN, SrcQP, Flags
	require.Equal(t, setByPoll, reflect.TypeOf(verbs.WorkCompletion{}).NumField(),
		"verbs.WorkCompletion changed: set the new field in cq.Poll, then update this count")
}
