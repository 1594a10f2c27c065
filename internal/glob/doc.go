// Package glob matches shell-style patterns against symbol and probe names.
//
// Unlike path.Match, '*' crosses every character, '/', '.' and ':' included,
// because the names it matches are Go ("main.(*T).Run"), C++ ("ns::f") and
// USDT ("provider:name") names, not paths. A pattern always matches the whole
// name. Matching works on bytes and does not allocate, so that a caller can
// test hundreds of thousands of names read in place from an ELF string table.
package glob
