package multiprobe

// SetFaultAt sets the hook that Pin and Update call at the points where a
// crash leaves a pin directory half-made (see pin_recover.go).
func SetFaultAt(f func(point string) error) { faultAt = f }
