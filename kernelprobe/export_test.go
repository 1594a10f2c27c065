package kernelprobe

// ResetForTest is resetForTest, for the external tests.
var ResetForTest = resetForTest
