package main

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// fetchKernel returns the path of the newest cloud kernel of s, downloading
// it once into cache, and its release ("6.1.0-50"). The suite is reached
// through a throw-away apt configuration on the machine's own mirror; the
// release comes from the suite's cloud metapackage, so the newest kernel
// of the series is used and none is written down that could leave the
// archive. Without the network, the newest cached kernel of the series is
// used.
func fetchKernel(cache string, s series) (path, release string, err error) {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", "", err
	}
	opts, err := aptFor(cache, s.suite, "amd64")
	if err != nil {
		return "", "", err
	}
	release = latestABI(opts, s)
	if release == "" {
		release = cachedABI(cache, s)
	}
	if release == "" {
		return "", "", fmt.Errorf("found no linux-image-cloud-amd64 of Linux %s in %s, and none cached in %s", s.version, s.suite, cache)
	}
	path = filepath.Join(cache, "vmlinuz-"+release+"-cloud-amd64")
	if st, err := os.Stat(path); err == nil && st.Size() > 0 {
		return path, release, nil
	}
	dl, err := os.MkdirTemp("", "vmrun-dl-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(dl)
	os.Chmod(dl, 0o777) // apt-get download fetches as the user _apt
	pkg := "linux-image-" + release + "-cloud-amd64-unsigned"
	get := exec.Command("apt-get", append(opts, "download", "-qq", pkg)...)
	get.Dir = dl
	if out, err := get.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("downloading %s: %v\n%s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
	if len(debs) != 1 {
		return "", "", fmt.Errorf("downloading %s: %d packages", pkg, len(debs))
	}
	if err := extractKernel(debs[0], "./boot/vmlinuz-"+release+"-cloud-amd64", path); err != nil {
		return "", "", fmt.Errorf("%s: %w", pkg, err)
	}
	return path, release, nil
}

// aptFor returns apt options for a configuration of its own that sees one
// suite and architecture of the system's mirror, fetching its package
// lists the first time.
func aptFor(cache, suite, arch string) ([]string, error) {
	dir := filepath.Join(cache, "apt-"+suite+"-"+arch)
	for _, d := range []string{"lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	uri := mirror()
	if uri == "" {
		return nil, errors.New("no Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list")
	}
	line := fmt.Sprintf("deb [arch=%s] %s %s main\n", arch, uri, suite)
	if err := os.WriteFile(filepath.Join(dir, "sources.list"), []byte(line), 0o644); err != nil {
		return nil, err
	}
	opts := []string{
		"-o", "Dir::Etc::sourcelist=" + filepath.Join(dir, "sources.list"), "-o", "Dir::Etc::sourceparts=-",
		"-o", "Dir::State::Lists=" + filepath.Join(dir, "lists"), "-o", "Dir::Cache=" + filepath.Join(dir, "cache"),
		"-o", "APT::Architectures::=" + arch,
	}
	if lists, _ := filepath.Glob(filepath.Join(dir, "lists", "*Packages*")); len(lists) == 0 {
		exec.Command("apt-get", append(opts, "update", "-qq")...).Run()
	}
	return opts, nil
}

// mirror returns the first Debian mirror the system's apt sources name.
func mirror() string {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, f := range append(files, "/etc/apt/sources.list") {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(string(data)))
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			switch {
			case len(fields) >= 2 && fields[0] == "URIs:":
				return fields[1]
			case len(fields) >= 2 && fields[0] == "deb":
				for _, f := range fields[1:] {
					if !strings.HasPrefix(f, "[") && !strings.HasSuffix(f, "]") {
						return f
					}
				}
			}
		}
	}
	return ""
}

// latestABI asks the suite's cloud metapackage which kernel it depends on.
func latestABI(opts []string, s series) string {
	for try := 0; try < 2; try++ {
		out, _ := exec.Command("apt-cache", append(opts, "depends", "linux-image-cloud-amd64")...).Output()
		for _, m := range abiPattern.FindAllStringSubmatch(string(out), -1) {
			if strings.HasPrefix(m[1], s.version+".") {
				return m[1]
			}
		}
		exec.Command("apt-get", append(opts, "update", "-qq")...).Run()
	}
	return ""
}

// cachedABI returns the newest kernel of s in the cache.
func cachedABI(cache string, s series) string {
	paths, _ := filepath.Glob(filepath.Join(cache, "vmlinuz-"+s.version+".*-cloud-amd64"))
	sort.Strings(paths)
	if len(paths) == 0 {
		return ""
	}
	name := filepath.Base(paths[len(paths)-1])
	return strings.TrimSuffix(strings.TrimPrefix(name, "vmlinuz-"), "-cloud-amd64")
}

// extractKernel copies the file member of the .deb to dst.
func extractKernel(deb, member, dst string) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer cmd.Wait()
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return fmt.Errorf("no %s in the package", member)
		}
		if err != nil {
			return err
		}
		if h.Name != member {
			continue
		}
		tmp := dst + ".tmp"
		f, err := os.Create(tmp)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		io.Copy(io.Discard, out)
		return os.Rename(tmp, dst)
	}
}
