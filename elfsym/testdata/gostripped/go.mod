module gostripped

go 1.26
