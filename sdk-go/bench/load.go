package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// target is one agent reached one way, and the process whose CPU time its calls cost.
type target struct {
	name string
	pid  int
	call func(context.Context) error
}

type roundResult struct {
	CallsPerS         float64 `json:"calls_per_s"`
	Calls             int     `json:"calls"`
	Errors            int     `json:"errors"`
	P50Ms             float64 `json:"p50_ms"`
	P99Ms             float64 `json:"p99_ms"`
	AgentCPUUsPerCall float64 `json:"agent_cpu_us_per_call"`
}

// run keeps concurrency calls in flight for duration (closed loop: each worker calls again when answered);
// calls still in flight at the end finish and count, over the time they took.
func (t *target) run(ctx context.Context, duration time.Duration, concurrency int) roundResult {
	cpuBefore := cpuSeconds(t.pid)
	started := time.Now()
	deadline := started.Add(duration)
	latencies := make([][]time.Duration, concurrency)
	failures := make([]int, concurrency)
	var workers sync.WaitGroup
	for worker := range concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for time.Now().Before(deadline) {
				callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				began := time.Now()
				if err := t.call(callCtx); err != nil {
					failures[worker]++
				}
				cancel()
				latencies[worker] = append(latencies[worker], time.Since(began))
			}
		}()
	}
	workers.Wait()
	elapsed := time.Since(started).Seconds()
	cpu := cpuSeconds(t.pid) - cpuBefore
	all := slices.Concat(latencies...)
	slices.Sort(all)
	errors := 0
	for _, failed := range failures {
		errors += failed
	}
	result := roundResult{Calls: len(all), Errors: errors, CallsPerS: float64(len(all)) / elapsed}
	if len(all) > 0 {
		result.P50Ms = milliseconds(all[len(all)/2])
		result.P99Ms = milliseconds(all[min(len(all)-1, len(all)*99/100)])
		result.AgentCPUUsPerCall = cpu / float64(len(all)) * 1e6
	}
	return result
}

func milliseconds(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// cpuSeconds is the user and system CPU time process pid has used so far (0 if it cannot be read).
func cpuSeconds(pid int) float64 {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// The fields after the command name, which may hold spaces and ends at the last ')'.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	user, _ := strconv.ParseFloat(fields[11], 64)
	system, _ := strconv.ParseFloat(fields[12], 64)
	return (user + system) / clockTicks
}

// clockTicks is the kernel's USER_HZ, 100 on every Linux platform Go runs on.
const clockTicks = 100

type sideResult struct {
	BestCallsPerS     float64       `json:"best_calls_per_s"`
	MedianCallsPerS   float64       `json:"median_calls_per_s"`
	AgentCPUUsPerCall float64       `json:"agent_cpu_us_per_call"`
	P50Ms             float64       `json:"p50_ms"`
	Errors            int           `json:"errors"`
	Rounds            []roundResult `json:"rounds"`
}

type modeResult struct {
	Go          sideResult `json:"go"`
	Python      sideResult `json:"python"`
	BestRatio   float64    `json:"go_to_python_best_calls_per_s"`
	MedianRatio float64    `json:"go_to_python_median_calls_per_s"`
	CPURatio    float64    `json:"python_to_go_agent_cpu_per_call"`
}

type report struct {
	Machine     map[string]string      `json:"machine"`
	Seconds     int                    `json:"seconds_per_round"`
	Rounds      int                    `json:"rounds"`
	Concurrency int                    `json:"concurrency"`
	Modes       map[string]*modeResult `json:"modes"`
}

// summarize keeps a side's best round (noise only ever slows), its median, the least CPU per call and the
// median round's latency.
func summarize(rounds []roundResult) sideResult {
	byRate := slices.Clone(rounds)
	slices.SortFunc(byRate, func(a, b roundResult) int { return cmp.Compare(a.CallsPerS, b.CallsPerS) })
	median := byRate[len(byRate)/2]
	result := sideResult{BestCallsPerS: byRate[len(byRate)-1].CallsPerS, MedianCallsPerS: median.CallsPerS,
		P50Ms: median.P50Ms, AgentCPUUsPerCall: rounds[0].AgentCPUUsPerCall, Rounds: rounds}
	for _, round := range rounds {
		result.AgentCPUUsPerCall = min(result.AgentCPUUsPerCall, round.AgentCPUUsPerCall)
		result.Errors += round.Errors
	}
	return result
}

func printTable(result *report) {
	fmt.Printf("machine: %s, %s cores, %s, Python %s; %d rounds of %d s, %d calls in flight\n",
		result.Machine["cpu"], result.Machine["cores"], result.Machine["go"], result.Machine["python"],
		result.Rounds, result.Seconds, result.Concurrency)
	fmt.Printf("%-8s %-8s %12s %12s %10s %16s %8s\n", "mode", "agent", "best/s", "median/s", "p50 ms",
		"agent CPU us/call", "errors")
	for _, mode := range []string{"router", "direct"} {
		measured := result.Modes[mode]
		if measured == nil {
			continue
		}
		for _, side := range []struct {
			name string
			sideResult
		}{{"go", measured.Go}, {"python", measured.Python}} {
			fmt.Printf("%-8s %-8s %12.0f %12.0f %10.2f %16.1f %8d\n", mode, side.name, side.BestCallsPerS,
				side.MedianCallsPerS, side.P50Ms, side.AgentCPUUsPerCall, side.Errors)
		}
		fmt.Printf("%-8s Go/Python calls/s: best %.2fx, median %.2fx; Python/Go agent CPU per call %.2fx\n", mode,
			measured.BestRatio, measured.MedianRatio, measured.CPURatio)
	}
}

// describeMachine is what the figures were measured on.
func describeMachine(venv string) map[string]string {
	cpu := "unknown"
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if name, found := strings.CutPrefix(line, "model name"); found {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	python, _ := exec.Command(filepath.Join(venv, "bin", "python"), "-c",
		"import platform; print(platform.python_version())").Output()
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return map[string]string{"cpu": cpu, "cores": strconv.Itoa(runtime.NumCPU()), "go": runtime.Version(),
		"python": strings.TrimSpace(string(python)), "kernel": strings.TrimSpace(string(kernel))}
}
