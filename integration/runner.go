package integration

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
)

// runnerScript is started once per container; it starts every later command there (see the
// script for why and for its protocol).
//
//go:embed runner.py
var runnerScript string

// runner is one container's resident command runner.
type runner struct {
	node    string
	mu      sync.Mutex // guards everything below and orders writes to stdin
	stdin   io.WriteCloser
	nextID  uint64
	pending map[uint64]*Process
	err     error // set once the runner's stream has ended: every later Start fails with it
}

type runnerReply struct {
	ID     uint64 `json:"id"`
	Ready  bool   `json:"ready"`
	Code   int    `json:"code"`
	Stdout []byte `json:"stdout"` // base64 in the JSON
	Stderr []byte `json:"stderr"`
	Error  string `json:"error"`
}

// startRunner starts the runner in a container with one docker exec whose stdin stays open,
// and waits for its first line. wrap is a command the runner runs under (the mesh's namespace
// nodes: `ip netns exec NS`), or none. A start that fails is tried again (runnerStartAttempts
// in all): the lab's Docker API is reached through QEMU's user-mode network, which has reset
// a connection now and then, and an exec that was created but never attached costs nothing.
func startRunner(ctx context.Context, cli *client.Client, name, containerID string, wrap ...string) (*runner, error) {
	var err error
	for attempt := 1; attempt <= runnerStartAttempts; attempt++ {
		var r *runner
		if r, err = startRunnerOnce(ctx, cli, name, containerID, wrap...); err == nil {
			return r, nil
		}
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(os.Stderr, "lab: %s: command runner start %d/%d failed: %v\n", name, attempt, runnerStartAttempts, err)
		time.Sleep(time.Second)
	}
	return nil, err
}

const runnerStartAttempts = 3

func startRunnerOnce(ctx context.Context, cli *client.Client, name, containerID string, wrap ...string) (*runner, error) {
	created, err := cli.ExecCreate(ctx, containerID, client.ExecCreateOptions{
		Cmd: append(wrap, "python3", "-u", "-c", runnerScript), AttachStdin: true, AttachStdout: true, AttachStderr: true,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: starting the command runner: %w", name, err)
	}
	// The attachment outlives ctx (a setup step's): it is the container's for the whole run.
	att, err := cli.ExecAttach(context.WithoutCancel(ctx), created.ID, client.ExecAttachOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s: starting the command runner: %w", name, err)
	}
	r := &runner{node: name, stdin: att.Conn, pending: map[uint64]*Process{}}
	pr, pw := io.Pipe()
	var stderr strings.Builder
	go func() {
		_, err := stdcopy.StdCopy(pw, &stderr, att.Reader)
		pw.CloseWithError(err) // nil: the reader sees a plain EOF
	}()
	ready := make(chan error, 1)
	go r.readReplies(pr, ready, &stderr, att.Close)
	select {
	case err := <-ready:
		if err != nil {
			att.Close()
			return nil, err
		}
		return r, nil
	case <-time.After(2 * time.Minute):
		att.Close()
		return nil, fmt.Errorf("%s: the command runner did not start in 2 minutes", name)
	}
}

// readReplies hands each finished command's result to its Process; when the stream ends,
// every pending and later command fails with the reason.
func (r *runner) readReplies(stream io.Reader, ready chan<- error, stderr *strings.Builder, closeConn func()) {
	defer closeConn()
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 64<<10), 1<<30)
	started := false
	for sc.Scan() {
		var rep runnerReply
		if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
			r.fail(fmt.Errorf("%s: command runner sent %.200q: %w", r.node, sc.Text(), err))
			break
		}
		if rep.Ready && !started {
			started = true
			ready <- nil
			continue
		}
		r.finish(rep)
	}
	r.fail(fmt.Errorf("%s: the command runner's stream ended (%v): %s", r.node, sc.Err(), strings.TrimSpace(stderr.String())))
	if !started {
		ready <- r.err
	}
}

func (r *runner) finish(rep runnerReply) {
	r.mu.Lock()
	p := r.pending[rep.ID]
	delete(r.pending, rep.ID)
	r.mu.Unlock()
	if p == nil {
		return
	}
	p.stdout.Write(rep.Stdout)
	p.stderr.Write(rep.Stderr)
	p.code = rep.Code
	if rep.Error != "" {
		p.code, p.err = -1, fmt.Errorf("%s: %s: %s", r.node, strings.Join(p.cmd, " "), rep.Error)
	}
	close(p.done)
}

func (r *runner) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
	for id, p := range r.pending {
		p.err = r.err
		close(p.done)
		delete(r.pending, id)
	}
}

// start sends one command; its Process completes when the runner reports its exit.
func (r *runner) start(p *Process, env []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.nextID++
	line, err := json.Marshal(map[string]any{"id": r.nextID, "argv": p.argv, "env": env})
	if err != nil {
		return err
	}
	r.pending[r.nextID] = p
	if _, err := r.stdin.Write(append(line, '\n')); err != nil {
		delete(r.pending, r.nextID)
		return fmt.Errorf("%s: sending a command to the runner: %w", r.node, err)
	}
	return nil
}

// close ends the runner (commands it started keep running until the container goes).
func (r *runner) close() {
	if r != nil {
		r.stdin.Close()
	}
}
