// Package elfsym resolves glob patterns over an ELF file's function symbols
// into the sites that a uprobe attaches to.
//
// A [Site] is one probe-able address: its name (and the other names at the
// same address, as aliases), binding, type, size, virtual address and the
// file offset the kernel wants, computed from the PT_LOAD program header
// that contains the address. Symbols come from .symtab and .dynsym together;
// a stripped Go binary's functions come from .gopclntab. Undefined and
// zero-value symbols are skipped, IFUNCs included, versioned dynamic symbols
// resolved to their default version unless a pattern names another.
//
// The symbol tables are read in place from a memory-mapped file and names
// are compared as bytes, so resolving a handful of functions in a binary of
// hundreds of thousands of symbols touches only the symbol and string
// tables and allocates only for the sites it returns. A big lookup spreads
// its passes over the tables, and the building of its sites, across CPUs;
// [File.Select] returns the sites' offsets before their Sites are built, so
// that a caller can hand them to the kernel meanwhile.
//
// Patterns follow internal/glob: '*', '?', '[abc]', '[a-z]', '[!x]', where
// '*' crosses '/', '.' and "::" so that Go and C++ names match naturally. A
// pattern starting with '!' excludes what it matches from the inclusions.
package elfsym
