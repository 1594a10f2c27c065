package elfsym

import "golang.org/x/sys/unix"

// mapPopulate faults a mapping in when it is made: one call instead of a
// fault per page as the tables are read.
const mapPopulate = unix.MAP_POPULATE
