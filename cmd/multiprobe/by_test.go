package main

import "testing"

// TestContainerID: the container id in a cgroup path, as the runtimes
// name their cgroups (systemd and cgroupfs drivers).
func TestContainerID(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct{ cgroup, want string }{
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-" + id + ".scope", id},
		{"/kubepods/burstable/pod1234/" + id, id},
		{"/system.slice/docker-" + id + ".scope", id},
		{"/machine.slice/libpod-" + id + ".scope/container", id},
		{"/kubepods.slice/kubepods-pod1.slice/crio-" + id + ".scope", id},
		{"/user.slice/user-0.slice/session-1.scope", ""},
		{"/", ""},
		{"/x/" + id[:63], ""},
	} {
		if got := containerID(tc.cgroup); got != tc.want {
			t.Errorf("containerID(%q) = %q, want %q", tc.cgroup, got, tc.want)
		}
	}
}
