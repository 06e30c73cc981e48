// Package localproc holds what the end-to-end tests and the bench both need to run the mesh as child
// processes on 127.0.0.1: ports a child can bind safely, stopping a child, waiting for a condition.
package localproc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// EphemeralPorts is the kernel's range for outgoing connections and binds of port 0.
func EphemeralPorts() (low, high int) {
	raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if _, err = fmt.Sscan(string(raw), &low, &high); err == nil && low <= high {
			return low, high
		}
	}
	return 32768, 60999
}

var (
	portsMu sync.Mutex
	// portsChosen holds every port FreePort handed out in this process: none is handed out twice.
	portsChosen = map[int]bool{}
)

// PortShard is this process's share of the spare ports: those p with p % count == index. Test processes that
// run side by side (the Python suite's workers, and the Go tests each starts) are told theirs in
// AGENTREACH_PORT_SHARD ("index/count"), so two of them never hand one port to two servers; without it, all.
func PortShard() (index, count int) {
	if _, err := fmt.Sscanf(os.Getenv("AGENTREACH_PORT_SHARD"), "%d/%d", &index, &count); err == nil &&
		count > 0 && index >= 0 && index < count {
		return index, count
	}
	return 0, 1
}

// FreePort is a port of 127.0.0.1 to give a child process, free when chosen. It lies outside the kernel's
// ephemeral range, so between its choosing and the child binding it no outgoing connection or bind of
// port 0 (this process's or any other's) can take it, and in this process's PortShard.
func FreePort() (int, error) {
	low, high := EphemeralPorts()
	index, count := PortShard()
	var spare []int
	for port := 10_000; port <= 65_535; port++ {
		if (port < low || port > high) && port%count == index {
			spare = append(spare, port)
		}
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for _, i := range rand.Perm(len(spare)) {
		port := spare[i]
		if portsChosen[port] {
			continue
		}
		listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		_ = listener.Close()
		portsChosen[port] = true
		return port, nil
	}
	return 0, errors.New("no free port left outside the ephemeral range")
}

// Stop asks a child to stop (SIGTERM) and kills it if it has not within grace.
func Stop(process *exec.Cmd, grace time.Duration) {
	if process == nil || process.Process == nil || process.ProcessState != nil {
		return
	}
	_ = process.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = process.Process.Kill()
		<-done
	}
}

// WaitUntil polls condition until it holds, or fails at the deadline.
func WaitUntil(timeout time.Duration, condition func() bool) error {
	deadline := time.Now().Add(timeout)
	for !condition() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
