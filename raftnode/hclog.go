package raftnode

import (
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// newHCLogger routes the hashicorp libraries' logging into slog. Only warn
// and above pass: raft logs every election and snapshot at info, which is
// noise next to our own logs, while its warnings (failed heartbeats, slow
// disks) are what an operator needs.
func newHCLogger(log *slog.Logger, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        name,
		Level:       hclog.Warn,
		Output:      slogWriter{log},
		JSONFormat:  true,
		DisableTime: true,
	})
}

// slogWriter receives one JSON object per hclog entry (hclog writes each
// entry with a single Write) and re-emits it as a structured slog record.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil {
		w.log.Warn(strings.TrimSpace(string(p)))
		return len(p), nil
	}
	level := slog.LevelWarn
	switch m["@level"] {
	case "error":
		level = slog.LevelError
	case "info":
		level = slog.LevelInfo
	case "debug", "trace":
		level = slog.LevelDebug
	}
	msg, _ := m["@message"].(string)
	keys := make([]string, 0, len(m))
	for k := range m {
		if k == "@module" || !strings.HasPrefix(k, "@") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		args = append(args, strings.TrimPrefix(k, "@"), m[k])
	}
	w.log.Log(context.Background(), level, msg, args...)
	return len(p), nil
}
