module funclen

go 1.25.0
