package verbstest

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rsockio/rsock/verbs/soft"
)

// FuzzAgentSession serves a session of garbage to an agent on a soft provider: the agent
// must answer or stop with an error, never panic, and leave nothing behind. The seeds are
// sessions that create objects and drive them, with calls a bad client could make.
func FuzzAgentSession(f *testing.F) {
	session := func(calls ...string) []byte {
		var b []byte
		for _, c := range calls {
			b = append(b, frame(c)...)
		}
		return b
	}
	f.Add(session(`{"op":"devices"}`, `{"op":"open","name":"soft0"}`, `{"op":"allocPD","h":1}`,
		`{"op":"regMR","h":2,"n":4096,"access":7}`, `{"op":"createCQ","h":1,"n":16}`,
		`{"op":"createQP","h":2,"scq":4,"rcq":4,"caps":{"MaxSendWR":4,"MaxRecvWR":4,"MaxSendSGE":1,"MaxRecvSGE":1}}`,
		`{"op":"read","h":3,"off":4000,"n":96}`, `{"op":"read","h":3,"off":4000,"n":97}`,
		`{"op":"write","h":3,"off":-1,"data":"AA=="}`, `{"op":"poll","h":4,"n":0}`, `{"op":"poll","h":5,"n":1}`,
		`{"op":"postSend","h":5,"send":[{"Flags":8,"SGL":[{"Addr":1,"Length":4,"LKey":0}]}]}`,
		`{"op":"toInit","h":5}`, `{"op":"toRTR","h":5}`, `{"op":"close","h":2}`, `{"op":"close","h":99}`,
		`{"op":"wait","h":4}`, `{"op":"queryPort","h":1,"n":300}`, `{"op":"nonsense"}`, `{"op":"bye"}`))
	f.Add(session(`{"op":"open","name":"soft0"}`, `{"op":"createCQ","h":1,"n":1000000000}`, `{"op":"regMR","h":1,"n":5}`))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, in []byte) {
		fab := soft.New(soft.Options{Devices: 1})
		rw := struct {
			io.Reader
			io.Writer
		}{bytes.NewReader(in), io.Discard}
		serveAgent(rw, fab) // an error is a fine answer to garbage
		s := fab.Stats()
		require.Zero(t, s.Contexts+s.PDs+s.MRs+s.CQs+s.QPs+s.CompChannels, "left behind by a session: %+v", s)
	})
}
