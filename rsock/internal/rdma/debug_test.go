package rdma

import (
	"testing"
	"time"

	"github.com/rsockio/rsock/verbs/soft"
)

func TestDebugCloseWhilePeerWrites(t *testing.T) {
	f := soft.New(soft.Options{})
	a, b := connPair(t, f, Options{})
	go func() {
		buf := make([]byte, 1024)
		for {
			if _, err := b.Write(buf); err != nil {
				t.Log("writer:", err)
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	a.mu.Lock()
	t.Logf("before close: sqPosted %d sqDone %d writable %d fin %v err %v stats %+v", a.sqPosted, a.sqDone, a.fc.Writable(), a.fc.FINPending(), a.err, a.fc.Stats())
	a.mu.Unlock()
	start := time.Now()
	a.Close()
	t.Log("close took", time.Since(start))
	a.mu.Lock()
	t.Logf("after close: sqPosted %d sqDone %d writable %d fin %v err %v stats %+v", a.sqPosted, a.sqDone, a.fc.Writable(), a.fc.FINPending(), a.err, a.fc.Stats())
	a.mu.Unlock()
	start = time.Now()
	b.Close()
	t.Log("close b took", time.Since(start))
}
