package server

import (
	"io/fs"
	"os"
	"sync"
	"time"

	"sandboxd/guest/proto"
)

// fileJobMax is the largest file whose content an extraction hands to a writer; larger ones
// are written by the reading goroutine, as before.
const fileJobMax = 256 << 10

// fileJobsPerWriter bounds the files in flight (each holds a buffer of fileJobMax and an open
// descriptor) per writer.
const fileJobsPerWriter = 4

// fileWriters write, fchmod, time and close the small files an extraction created, on other
// goroutines than the one reading the tar: a restore's reading and decompressing, creating
// the files, and writing them then use more than one core. Only content goes to a writer: the
// names are still checked and the files created (O_EXCL, in their folder's descriptor) by the
// reader, in the tar's order, so no rule of extract depends on a writer. A writer's failure is
// the extraction's (submit and wait report the first); stop ends the writers, closing what
// they still hold, before the extraction's folders are closed.
type fileWriters struct {
	work    chan *fileJob
	free    chan *fileJob
	workers sync.WaitGroup
	pending sync.WaitGroup
	mu      sync.Mutex
	err     *proto.Error
	stopped sync.Once
}

type fileJob struct {
	buf   []byte
	f     *os.File
	n     int
	name  string
	mode  fs.FileMode
	mtime time.Time
}

func newFileWriters(n int) *fileWriters {
	w := &fileWriters{work: make(chan *fileJob), free: make(chan *fileJob, n*fileJobsPerWriter)}
	for range n * fileJobsPerWriter {
		w.free <- &fileJob{buf: make([]byte, fileJobMax)}
	}
	for range n {
		w.workers.Add(1)
		go w.run()
	}
	return w
}

// job returns a free job, waiting for one when all are in flight.
func (w *fileWriters) job() *fileJob { return <-w.free }

// put gives back a job that was not submitted.
func (w *fileWriters) put(j *fileJob) { w.free <- j }

// submit hands a job (its file open, its content in buf[:n]) to a writer, which closes the
// file. It reports the first failure of any writer so far.
func (w *fileWriters) submit(j *fileJob) *proto.Error {
	w.pending.Add(1)
	w.work <- j
	return w.failure()
}

// wait returns once every submitted file is written and closed, with the first failure.
func (w *fileWriters) wait() *proto.Error {
	w.pending.Wait()
	return w.failure()
}

func (w *fileWriters) failure() *proto.Error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// stop ends the writers after the jobs submitted; it may be called more than once.
func (w *fileWriters) stop() {
	w.stopped.Do(func() { close(w.work) })
	w.workers.Wait()
}

func (w *fileWriters) run() {
	defer w.workers.Done()
	for j := range w.work {
		_, err := j.f.Write(j.buf[:j.n])
		if err = finishFile(j.f, j.mode, j.mtime, err); err != nil {
			w.mu.Lock()
			if w.err == nil {
				w.err = entryError(j.name, err)
			}
			w.mu.Unlock()
		}
		j.f = nil
		w.free <- j
		w.pending.Done()
	}
}
