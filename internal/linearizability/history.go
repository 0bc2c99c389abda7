package linearizability

import (
	"math"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// History records operations from concurrent callers. It is safe for
// concurrent use.
type History struct {
	base time.Time

	mu  sync.Mutex // guards ops
	ops []porcupine.Operation
}

// NewHistory returns an empty history whose clock starts now.
func NewHistory() *History { return &History{base: time.Now()} }

func (h *History) now() int64 { return int64(time.Since(h.base)) }

// Call records that client is calling input now; call the returned
// function with the output when the call returns. A call whose done
// function is never called is left out: use Unknown outputs for
// mutations that may have happened.
func (h *History) Call(client int, input any) (done func(output any)) {
	call := h.now()
	return func(output any) {
		ret := h.now()
		if unknown(output) {
			// It may take effect at any time after the call, even after
			// every later call returned.
			ret = math.MaxInt64
		}
		h.mu.Lock()
		h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: input, Call: call, Output: output, Return: ret})
		h.mu.Unlock()
	}
}

// Operations returns a copy of the recorded operations.
func (h *History) Operations() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops...)
}

// Len is the number of recorded operations.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

func unknown(output any) bool {
	switch o := output.(type) {
	case KVOutput:
		return o.Unknown
	case LeaseOutput:
		return o.Unknown
	}
	return false
}

// Check checks ops against model within timeout. On Illegal (or Unknown,
// when the checker ran out of time) it writes porcupine's visualization
// to visualization, if that is not empty, so a failure can be read.
func Check(model porcupine.Model, ops []porcupine.Operation, timeout time.Duration, visualization string) porcupine.CheckResult {
	res, info := porcupine.CheckOperationsVerbose(model, ops, timeout)
	if res != porcupine.Ok && visualization != "" {
		_ = porcupine.VisualizePath(model, info, visualization)
	}
	return res
}
