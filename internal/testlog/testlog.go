// Package testlog holds what tests use to read the logs of code running on
// other goroutines.
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that a logger (or a process's output) writing
// from other goroutines and a test reading it can share. The zero value is
// ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p, as io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
