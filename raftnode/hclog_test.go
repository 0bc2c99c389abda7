package raftnode

import (
	"context"
	"log/slog"
	"sync"
	"testing"
)

// recordHandler keeps the records logged through it.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r)
	h.mu.Unlock()
	return nil
}

func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *recordHandler) WithGroup(string) slog.Handler { return h }

func TestHashicorpLogsBecomeStructuredSlogRecords(t *testing.T) {
	h := &recordHandler{}
	hl := newHCLogger(slog.New(h), "raft")
	hl.Info("elected", "term", 3) // below warn: dropped
	hl.Warn("failed to contact", "server-id", "n2")
	hl.Error("disk full")

	if len(h.records) != 2 {
		t.Fatalf("got %d records, expected: 2 (info is dropped)", len(h.records))
	}
	r := h.records[0]
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	if r.Level != slog.LevelWarn || r.Message != "failed to contact" || attrs["server-id"] != "n2" || attrs["module"] != "raft" {
		t.Errorf("warn record = %v %q %v, expected: WARN \"failed to contact\" with server-id=n2 module=raft", r.Level, r.Message, attrs)
	}
	if r := h.records[1]; r.Level != slog.LevelError || r.Message != "disk full" {
		t.Errorf("error record = %v %q, expected: ERROR \"disk full\"", r.Level, r.Message)
	}
}
