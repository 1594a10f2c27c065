module github.com/multiprobe/multiprobe

go 1.25.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/google/pprof v0.0.0-20260906184651-6331bc6350fe
	github.com/rogpeppe/go-internal v1.14.1
	github.com/ulikunitz/xz v0.5.17
	golang.org/x/arch v0.30.0
	golang.org/x/sync v0.22.0
	golang.org/x/sys v0.47.0
)

require golang.org/x/tools v0.40.1-0.20260108161641-ca281cf95054 // indirect

tool github.com/cilium/ebpf/cmd/bpf2go
