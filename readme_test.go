package multiprobe_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// TestReadmeGo follows the README's "Use it from Go" as a user would, each
// of its two ways (package count; a BPF program of one's own): the files
// it shows, saved in an empty directory, and its commands, run one by one, with a single line added after `go mod init`: a replace
// directive to this checkout, since the module is not fetched from a
// proxy here. The counts the program prints must name the sites the
// README's output names, in its order, each called at least once. When
// the text and the code part, this test fails.
func TestReadmeGo(t *testing.T) {
	probetest.RequireBPF(t)
	if testutil.InGuest() {
		t.Skip("the README is the host's; a test VM has only the test binaries")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		heading string
		files   []string
		tools   []string
	}{
		{"### Count calls with package count", []string{"main.go"}, []string{"go"}},
		{"### Your own BPF program", []string{"main.go", "probe.bpf.c"}, []string{"go", "clang-19"}},
	} {
		t.Run(strings.TrimPrefix(c.heading, "### "), func(t *testing.T) {
			for _, tool := range c.tools {
				_, err := exec.LookPath(tool)
				testutil.RequireTool(t, tool, err)
			}
			readmeGo(t, section(readme, c.heading), c.files)
		})
	}
}

// readmeGo runs the commands of a README section, with the files it
// shows (want, at least), and checks their output against the section's.
func readmeGo(t *testing.T, text string, want []string) {
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	blocks := fencedBlocks(text)
	files := map[string]string{}
	var script, output string
	for _, b := range blocks {
		switch {
		case b.lang == "sh" && script == "":
			script = b.text
		case b.lang == "" && output == "":
			output = b.text
		case b.file != "":
			files[b.file] = b.text
		}
	}
	if script == "" || output == "" || slices.ContainsFunc(want, func(f string) bool { return files[f] == "" }) {
		t.Fatalf("README's Go section: want a sh block, its output and %v; got commands %q, output %q, files %v", want, script, output, keys(files))
	}

	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(line string) string {
		t.Helper()
		cmd := exec.Command("bash", "-e", "-c", line)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("README line %q: %v\nstdout:\n%s\nstderr:\n%s", line, err, stdout.String(), stderr.String())
		}
		return stdout.String()
	}
	var got string
	var ran []string
	for line := range strings.Lines(script) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "apt-get install ") {
			continue // the packages are .ci/install-deps's
		}
		ran = append(ran, line)
		out := run(line)
		if strings.HasPrefix(line, "go mod init ") {
			run("go mod edit -replace github.com/multiprobe/multiprobe=" + root)
		}
		if strings.HasPrefix(line, "go run ") {
			got = out
		}
	}
	if got == "" {
		t.Fatalf("README's commands %q printed nothing, or ran no `go run`", ran)
	}
	t.Logf("output:\n%s", got)
	wantLines, gotLines := strings.Fields(output), strings.Fields(got)
	if len(gotLines) != len(wantLines) {
		t.Fatalf("got %d words, the README shows %d:\n%s", len(gotLines), len(wantLines), output)
	}
	for i := 0; i < len(wantLines); i += 2 {
		if gotLines[i] != wantLines[i] {
			t.Errorf("site %d: got %s, the README shows %s", i/2, gotLines[i], wantLines[i])
		}
		if n, err := strconv.ParseUint(gotLines[i+1], 10, 64); err != nil || n == 0 {
			t.Errorf("%s: count %q, want a number above 0", gotLines[i], gotLines[i+1])
		}
	}
}

// section returns the text of a Markdown section: from its heading to the
// next heading of the same level.
func section(doc []byte, heading string) string {
	s := string(doc)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		return ""
	}
	s = s[i+1+len(heading):]
	level := heading[:strings.IndexByte(heading, ' ')+1]
	if j := strings.Index(s, "\n"+level); j >= 0 {
		s = s[:j]
	}
	return s
}

type fencedBlock struct {
	lang string
	file string // from the paragraph before it: "`main.go`:" or "`probe.bpf.c`, ..."
	text string
}

var (
	fenceRE = regexp.MustCompile("(?ms)^```(\\w*)\\n(.*?)^```\\n")
	fileRE  = regexp.MustCompile("(?m)^`([\\w.]+\\.(?:go|c))`[,:]")
)

// fencedBlocks returns a Markdown text's fenced code blocks, each with the
// file name its introducing paragraph starts with, if any.
func fencedBlocks(s string) []fencedBlock {
	var blocks []fencedBlock
	prev := 0
	for _, m := range fenceRE.FindAllStringSubmatchIndex(s, -1) {
		b := fencedBlock{lang: s[m[2]:m[3]], text: s[m[4]:m[5]]}
		if f := fileRE.FindAllStringSubmatch(s[prev:m[0]], -1); len(f) > 0 {
			b.file = f[len(f)-1][1]
		}
		blocks = append(blocks, b)
		prev = m[1]
	}
	return blocks
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestReadmeLayout: every package of the tree, examples' modules included,
// is in the README's layout table: a top-level package, cmd/ and examples/
// by their paths in the first column, internal/ ones by name in the
// internal row (or, for the test kits, in the testprogs row).
func TestReadmeLayout(t *testing.T) {
	if testutil.InGuest() {
		t.Skip("the README and the tree are the host's; a test VM has only the test binaries")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	table := string(section(readme, "## Layout"))
	first := map[string]bool{}
	internalRows := ""
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		first[strings.Fields(name + " x")[0]] = true
		if strings.HasPrefix(name, "internal/") {
			internalRows += line
		}
	}
	var missing []string
	err = filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata" || d.Name() == "bpf") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || filepath.Dir(path) == "." {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		if rest, ok := strings.CutPrefix(dir, "internal/"); ok {
			if !strings.Contains(internalRows, "`"+rest+"`") && !first[dir] {
				missing = append(missing, dir)
			}
		} else if !first[dir] {
			missing = append(missing, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(missing)
	if missing = slices.Compact(missing); len(missing) > 0 {
		t.Errorf("packages missing from the README's layout table: %v", missing)
	}
}
