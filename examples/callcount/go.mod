module example.com/callcount

go 1.25.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/multiprobe/multiprobe v0.0.0
)

require (
	github.com/ulikunitz/xz v0.5.17 // indirect
	golang.org/x/arch v0.30.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
)

replace github.com/multiprobe/multiprobe => ../..

tool github.com/cilium/ebpf/cmd/bpf2go
