//go:build !linux

package elfsym

// mapPopulate is Linux's; elsewhere pages fault in as they are read.
const mapPopulate = 0
