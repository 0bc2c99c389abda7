package raftnode

import (
	"fmt"
	"log/slog"

	etcdraft "go.etcd.io/raft/v3"
)

// slogRaftLogger is etcd raft's Logger on slog. Raft's Info lines (term
// changes, elections, configuration changes) stay at Info; its Debug
// lines are per-message chatter.
type slogRaftLogger struct{ log *slog.Logger }

var _ etcdraft.Logger = slogRaftLogger{}

func (l slogRaftLogger) Debug(v ...any)                 { l.log.Debug(fmt.Sprint(v...)) }
func (l slogRaftLogger) Debugf(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l slogRaftLogger) Info(v ...any)                  { l.log.Info(fmt.Sprint(v...)) }
func (l slogRaftLogger) Infof(format string, v ...any)  { l.log.Info(fmt.Sprintf(format, v...)) }
func (l slogRaftLogger) Warning(v ...any)               { l.log.Warn(fmt.Sprint(v...)) }
func (l slogRaftLogger) Warningf(format string, v ...any) {
	l.log.Warn(fmt.Sprintf(format, v...))
}
func (l slogRaftLogger) Error(v ...any)                 { l.log.Error(fmt.Sprint(v...)) }
func (l slogRaftLogger) Errorf(format string, v ...any) { l.log.Error(fmt.Sprintf(format, v...)) }
func (l slogRaftLogger) Fatal(v ...any)                 { l.Panic(v...) }
func (l slogRaftLogger) Fatalf(format string, v ...any) { l.Panicf(format, v...) }

// Panic logs and panics: raft calls it on a broken invariant, where
// going on could corrupt the state.
func (l slogRaftLogger) Panic(v ...any) {
	msg := fmt.Sprint(v...)
	l.log.Error(msg)
	panic(msg)
}

func (l slogRaftLogger) Panicf(format string, v ...any) { l.Panic(fmt.Sprintf(format, v...)) }
