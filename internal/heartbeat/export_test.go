package heartbeat

// OnBeat has fn called after each of p's beats, with the beat's error (nil
// for a beat that recorded the row), on the goroutine running p.Run. Set it
// before Run.
func (p *Process) OnBeat(fn func(err error)) { p.b.beaten = fn }
