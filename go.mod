module github.com/multiprobe/multiprobe

go 1.25.0

require (
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sync v0.22.0
	golang.org/x/sys v0.47.0
)

require golang.org/x/arch v0.30.0

tool github.com/cilium/ebpf/cmd/bpf2go
