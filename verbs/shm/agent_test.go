package shm

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/verbstest"
)

// agentEnv, set in a re-executed test binary's environment, makes it the peer process of
// the two-process tests: it serves one verbstest agent session on a shm provider, on the
// loopback TCP address it prints on its first line of output.
const agentEnv = "RSOCK_SHM_AGENT"

// agentSessions, as agentEnv's value, makes the peer process serve any number of
// sessions, each on a provider of its own (see [startAgents]); any other value, one.
const agentSessions = "sessions"

// runAgentIfAsked runs the agent and reports true if this process was started as one.
func runAgentIfAsked() bool {
	mode := os.Getenv(agentEnv)
	if mode == "" {
		return false
	}
	run := runAgent
	if mode == agentSessions {
		run = runAgents
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "shm agent:", err)
		os.Exit(1)
	}
	return true
}

func runAgent() error {
	p, err := New(Options{})
	if err != nil {
		return err
	}
	defer p.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr())
	return verbstest.ServeAgent(ln, p)
}

// peerProcess is a re-executed test binary serving a shm provider as an agent.
type peerProcess struct {
	cmd  *exec.Cmd
	prov *verbstest.RemoteProvider
}

// startPeer starts a peer process and connects to its agent. It is killed, if still
// running, when the test ends.
func startPeer(t *testing.T) *peerProcess {
	t.Helper()
	pp := &peerProcess{}
	var addr string
	pp.cmd, addr = startAgentProcess(t, "1")
	t.Cleanup(func() {
		if pp.prov != nil {
			pp.prov.Close()
		}
	})
	var err error
	pp.prov, err = verbstest.DialAgent(context.Background(), addr)
	if err != nil {
		t.Fatalf("dial the peer's agent: %v", err)
	}
	return pp
}

// startAgentProcess re-executes the test binary as an agent in mode (agentEnv's value)
// and returns it with the address it serves on. The process is killed, if still
// running, when the test ends, after the cleanups registered later.
func startAgentProcess(t *testing.T, mode string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), agentEnv+"="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start peer process: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read the peer's address: %v", err)
	}
	return cmd, strings.TrimSpace(line)
}

// runAgents serves verbstest agent sessions on the loopback TCP address it prints on
// its first line of output, until the process is killed. Each session gets a shm
// provider of its own, closed when the session ends, so that a session sees a peer
// process as fresh as one started for it; sessions run concurrently, so that one a
// failed test left hanging holds up no other.
func runAgents() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			if err := serveSession(c); err != nil {
				fmt.Fprintln(os.Stderr, "shm agent:", err)
			}
		}()
	}
}

// serveSession serves one agent session on c with a new provider.
func serveSession(c net.Conn) error {
	p, err := New(Options{})
	if err != nil {
		c.Close()
		return err
	}
	defer p.Close()
	return verbstest.ServeAgent(&connListener{c: c, addr: c.LocalAddr()}, p) // closes c
}

// connListener is a net.Listener whose one connection is already accepted.
type connListener struct {
	c    net.Conn
	addr net.Addr
}

func (l *connListener) Accept() (net.Conn, error) {
	c := l.c
	if c == nil {
		return nil, net.ErrClosed
	}
	l.c = nil
	return c, nil
}

func (l *connListener) Close() error   { return nil }
func (l *connListener) Addr() net.Addr { return l.addr }

// TestConformancePeerProcess runs the conformance suite with side b of every pair in
// another process: the two processes share only the memory of the regions they pass each
// other and the sockets of their devices. One peer process serves every rule, each on a
// provider of its own: a process per rule cost as much again as the suite.
func TestConformancePeerProcess(t *testing.T) {
	_, addr := startAgentProcess(t, agentSessions)
	verbstest.Suite{Providers: func(t *testing.T) (a, b verbs.Provider) {
		a = newProvider(t, 1)
		peer, err := verbstest.DialAgent(context.Background(), addr)
		if err != nil {
			t.Fatalf("dial the peer's agent: %v", err)
		}
		t.Cleanup(func() { peer.Close() })
		return a, peer
	}}.Run(t)
}
